package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// marshalJSON renders m as the documented --json output: protojson with proto
// field names and every field present, indented by two spaces. protojson
// deliberately varies its whitespace between builds, so the result is
// compacted and re-indented to keep the bytes stable.
func marshalJSON(m proto.Message) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("marshal %s: %w", m.ProtoReflect().Descriptor().FullName(), err)
	}
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, fmt.Errorf("compact JSON: %w", err)
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, fmt.Errorf("indent JSON: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// humanBytes prints a byte count in binary units with one decimal: 79.6 GiB.
// Zero means unknown for every byte field of the API, so it prints "-".
func humanBytes(n uint64) string {
	if n == 0 {
		return "-"
	}
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v := float64(n) / 1024
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
}

// typeName is the short name of a device type, the prefix of its IDs.
func typeName(t brokerv1.DeviceType) string {
	switch t {
	case brokerv1.DeviceType_DEVICE_TYPE_CPU:
		return "cpu"
	case brokerv1.DeviceType_DEVICE_TYPE_GPU:
		return "gpu"
	case brokerv1.DeviceType_DEVICE_TYPE_TPU:
		return "tpu"
	case brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU:
		return "amdgpu"
	case brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU:
		return "edgetpu"
	}
	return "unknown"
}

// enumName is an enum value without its type prefix, lower case:
// DEVICE_HEALTH_HEALTHY -> healthy.
func enumName(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) string {
	if ed.FullName() == brokerv1.DeviceType(0).Descriptor().FullName() {
		return typeName(brokerv1.DeviceType(n))
	}
	v := ed.Values().ByNumber(n)
	if v == nil {
		return strconv.Itoa(int(n))
	}
	name := string(v.Name())
	if zero := string(ed.Values().Get(0).Name()); strings.HasSuffix(zero, "_UNSPECIFIED") {
		name = strings.TrimPrefix(name, strings.TrimSuffix(zero, "UNSPECIFIED"))
	}
	return strings.ToLower(name)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// row writes one tab-separated table row; indent goes before the first cell
// of every row so an indented table stays aligned.
func row(w io.Writer, indent string, cells ...string) {
	fmt.Fprintf(w, "%s%s\n", indent, strings.Join(cells, "\t"))
}

// writeDeviceTable prints devices as an aligned table. wide adds identity,
// driver and telemetry columns, and why a device has no runtime.
func writeDeviceTable(w io.Writer, devs []*brokerv1.Device, wide bool, indent string) error {
	tw := newTable(w)
	header := []string{"ID", "TYPE", "NAME", "MEMORY", "BUDGET", "RUNTIME", "HEALTH", "CORDONED"}
	if wide {
		header = append(header, "UUID", "PCI BUS", "DRIVER", "CC", "TEMP", "POWER", "UTIL")
	}
	row(tw, indent, header...)
	for _, d := range devs {
		runtime := d.GetRuntime()
		if !d.GetRunnable() || runtime == "" {
			runtime = "-"
			if wide && d.GetRuntimeReason() != "" {
				runtime = "- (" + d.GetRuntimeReason() + ")"
			}
		}
		cells := []string{
			d.GetId(), typeName(d.GetType()), orDash(d.GetName()),
			humanBytes(d.GetMemoryTotalBytes()), humanBytes(d.GetMemoryBudgetBytes()),
			runtime, enumName(d.GetHealth().Descriptor(), d.GetHealth().Number()), yesNo(d.GetCordoned()),
		}
		if wide {
			cells = append(cells, orDash(d.GetUuid()), orDash(d.GetPciBusId()), orDash(d.GetDriverVersion()),
				orDash(d.GetComputeCapability()))
			cells = append(cells, telemetryCells(d.GetTelemetry())...)
		}
		row(tw, indent, cells...)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write device table: %w", err)
	}
	return nil
}

// telemetryCells are TEMP, POWER and UTIL; a device without telemetry, or
// without a sensor (zero), shows "-".
func telemetryCells(t *brokerv1.Telemetry) []string {
	if t == nil {
		return []string{"-", "-", "-"}
	}
	temp, power := "-", "-"
	if t.GetTemperatureCelsius() > 0 {
		temp = strconv.FormatFloat(t.GetTemperatureCelsius(), 'f', 0, 64) + " C"
	}
	if t.GetPowerWatts() > 0 {
		power = strconv.FormatFloat(t.GetPowerWatts(), 'f', 0, 64)
		if t.GetPowerLimitWatts() > 0 {
			power += "/" + strconv.FormatFloat(t.GetPowerLimitWatts(), 'f', 0, 64)
		}
		power += " W"
	}
	util := strconv.FormatFloat(t.GetUtilizationPercent(), 'f', 0, 64) + "%"
	return []string{temp, power, util}
}

// deviceAlways are Device (and nested info) fields printed even at their zero
// value, because the zero value is itself information (NUMA node 0, not
// cordoned, NVML index 0).
func deviceAlways(name protoreflect.Name) bool {
	switch name {
	case "id", "type", "numa_node", "runnable", "health", "cordoned", "nvml_index", "chip_index":
		return true
	}
	return false
}

// writeDeviceFields prints every populated field of d as "key: value",
// nested messages and maps as indented sections, so new API fields show up
// without changes here.
func writeDeviceFields(w io.Writer, d *brokerv1.Device) error {
	tw := newTable(w)
	writeFields(tw, d.ProtoReflect(), "", func(fd protoreflect.FieldDescriptor) bool { return deviceAlways(fd.Name()) })
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write device: %w", err)
	}
	return nil
}

// writeFields writes the populated fields of m (and those always says to
// show, at any depth) in declaration order.
func writeFields(w io.Writer, m protoreflect.Message, indent string, always func(protoreflect.FieldDescriptor) bool) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) && (always == nil || !always(fd)) {
			continue
		}
		name := string(fd.Name())
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			fmt.Fprintf(w, "%s%s:\n", indent, name)
			mp := v.Map()
			var keys []protoreflect.MapKey
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				keys = append(keys, k)
				return true
			})
			sort.Slice(keys, func(a, b int) bool { return keys[a].String() < keys[b].String() })
			for _, k := range keys {
				fmt.Fprintf(w, "%s  %s:\t%s\n", indent, k.String(), scalar(fd.MapValue(), mp.Get(k)))
			}
		case fd.IsList():
			l := v.List()
			if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
				for j := range l.Len() {
					fmt.Fprintf(w, "%s%s[%d]:\n", indent, name, j)
					writeFields(w, l.Get(j).Message(), indent+"  ", always)
				}
				continue
			}
			parts := make([]string, l.Len())
			for j := range l.Len() {
				parts[j] = scalar(fd, l.Get(j))
			}
			fmt.Fprintf(w, "%s%s:\t%s\n", indent, name, strings.Join(parts, ", "))
		case fd.Kind() == protoreflect.MessageKind && !isTimestamp(fd):
			fmt.Fprintf(w, "%s%s:\n", indent, name)
			writeFields(w, v.Message(), indent+"  ", always)
		default:
			fmt.Fprintf(w, "%s%s:\t%s\n", indent, name, scalar(fd, v))
		}
	}
}

func isTimestamp(fd protoreflect.FieldDescriptor) bool {
	md := fd.Message()
	return md != nil && md.FullName() == (&timestamppb.Timestamp{}).ProtoReflect().Descriptor().FullName()
}

// scalar formats one value for people: enums by short name, byte counts in
// binary units with the exact number, times in RFC 3339.
func scalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		return enumName(fd.Enum(), v.Enum())
	case protoreflect.BoolKind:
		return yesNo(v.Bool())
	case protoreflect.DoubleKind, protoreflect.FloatKind:
		return formatFloat(v.Float())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind, protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if strings.HasSuffix(string(fd.Name()), "_bytes") && v.Uint() > 0 {
			return fmt.Sprintf("%s (%d)", humanBytes(v.Uint()), v.Uint())
		}
		return strconv.FormatUint(v.Uint(), 10)
	case protoreflect.MessageKind:
		if isTimestamp(fd) {
			ts, ok := v.Message().Interface().(*timestamppb.Timestamp)
			if ok {
				return ts.AsTime().UTC().Format(time.RFC3339)
			}
		}
		return fmt.Sprint(v.Message().Interface())
	case protoreflect.BytesKind:
		return fmt.Sprintf("%x", v.Bytes())
	}
	return v.String()
}

// writeReport prints the routing report for people.
func writeReport(w io.Writer, r *brokerv1.GetReportResponse, verbose bool) error {
	tw := newTable(w)
	if r.GetHostname() != "" {
		row(tw, "", "host:", r.GetHostname())
	}
	if r.GetVersion() != "" {
		row(tw, "", "version:", r.GetVersion())
	}
	current := "none"
	if d := r.GetCurrentDevice(); d != nil {
		current = fmt.Sprintf("%s (%s, %s)", d.GetId(), typeName(d.GetType()), orDash(d.GetName()))
	}
	row(tw, "", "current device:", current)
	row(tw, "", "selection reason:", orDash(r.GetSelectionReason()))
	if len(r.GetFallbackChain()) > 0 {
		row(tw, "", "fallback chain:", strings.Join(r.GetFallbackChain(), " -> "))
	}
	row(tw, "", "routing mode:", enumName(r.GetRoutingMode().Descriptor(), r.GetRoutingMode().Number()))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}

	if cfg := r.GetConfiguration(); cfg != nil {
		fmt.Fprint(w, "\nconfiguration:\n")
		tw = newTable(w)
		writeFields(tw, cfg.ProtoReflect(), "  ", func(protoreflect.FieldDescriptor) bool { return true })
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write configuration: %w", err)
		}
	}

	fmt.Fprint(w, "\ndevices:\n")
	if err := writeDeviceTable(w, r.GetAllDevices(), verbose, "  "); err != nil {
		return err
	}

	fmt.Fprint(w, "\nruntimes:\n")
	if err := writeRuntimes(w, r.GetRuntimes(), verbose); err != nil {
		return err
	}

	if len(r.GetBatchPlans()) > 0 {
		fmt.Fprint(w, "\nbatch plans:\n")
		tw = newTable(w)
		row(tw, "  ", "TYPE", "DEVICE", "BASE", "FACTOR", "MIN", "MAX", "BUCKETS")
		for _, p := range r.GetBatchPlans() {
			row(tw, "  ", typeName(p.GetDeviceType()), orDash(p.GetDeviceId()), itoa(p.GetBaseBatch()), itoa(p.GetFactor()),
				itoa(p.GetMinBatch()), itoa(p.GetMaxBatch()), joinInts(p.GetBuckets(), " "))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write batch plans: %w", err)
		}
	}
	writeList(w, "recommendations", r.GetRecommendations())
	writeList(w, "notes", r.GetNotes())
	return nil
}

func writeList(w io.Writer, title string, items []string) {
	if len(items) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s:\n", title)
	for _, s := range items {
		fmt.Fprintf(w, "  - %s\n", s)
	}
}

// writeRuntimes prints the runtime adapters of the build; verbose adds each
// PJRT plugin's path, platform and API version.
func writeRuntimes(w io.Writer, rts []*brokerv1.Runtime, verbose bool) error {
	tw := newTable(w)
	row(tw, "  ", "NAME", "AVAILABLE", "DEVICE TYPES", "VERSION/REASON", "PLUGINS")
	for _, rt := range rts {
		types := make([]string, len(rt.GetDeviceTypes()))
		for i, t := range rt.GetDeviceTypes() {
			types[i] = typeName(t)
		}
		detail := rt.GetVersion()
		if !rt.GetAvailable() {
			detail = rt.GetReason()
		}
		plugins := make([]string, len(rt.GetPlugins()))
		for i, p := range rt.GetPlugins() {
			plugins[i] = p.GetName()
			if !p.GetLoaded() {
				plugins[i] += " (not loaded)"
			}
		}
		row(tw, "  ", rt.GetName(), yesNo(rt.GetAvailable()), orDash(strings.Join(types, ",")), orDash(detail), orDash(strings.Join(plugins, ", ")))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write runtimes: %w", err)
	}
	if !verbose {
		return nil
	}
	for _, rt := range rts {
		for _, p := range rt.GetPlugins() {
			fmt.Fprintf(w, "  plugin %s (%s): path=%s platform=%s api=%s loaded=%s",
				p.GetName(), rt.GetName(), orDash(p.GetPath()), orDash(p.GetPlatform()), orDash(p.GetApiVersion()), yesNo(p.GetLoaded()))
			if p.GetError() != "" {
				fmt.Fprintf(w, " error=%q", p.GetError())
			}
			fmt.Fprintln(w)
		}
	}
	return nil
}

// writeBatchPlan prints one plan as "key: value" lines.
func writeBatchPlan(w io.Writer, p *brokerv1.BatchPlan) error {
	tw := newTable(w)
	row(tw, "", "device type:", typeName(p.GetDeviceType()))
	if p.GetDeviceId() != "" {
		row(tw, "", "device:", p.GetDeviceId())
	}
	row(tw, "", "base:", itoa(p.GetBaseBatch()))
	row(tw, "", "factor:", itoa(p.GetFactor()))
	row(tw, "", "min:", itoa(p.GetMinBatch()))
	row(tw, "", "max:", itoa(p.GetMaxBatch()))
	row(tw, "", "buckets:", joinInts(p.GetBuckets(), " "))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write batch plan: %w", err)
	}
	return nil
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func joinInts(ns []int32, sep string) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = itoa(n)
	}
	return orDash(strings.Join(parts, sep))
}
