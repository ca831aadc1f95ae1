package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

func modelsCmd(fs *flag.FlagSet) action {
	wide := fs.Bool("wide", false, "add the inputs, outputs and errors of each model")
	asJSON := jsonFlag(fs, "ListModelsResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.ListModels(ctx, &brokerv1.ListModelsRequest{})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		if err := writeModelTable(&b, resp.GetModels(), *wide); err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

func loadCmd(fs *flag.FlagSet) action {
	version := fs.Int64("version", 0, "load version `V` (default: the highest loadable)")
	asJSON := jsonFlag(fs, "LoadModelResponse")
	return func(ctx context.Context, inv *invocation, args []string) error {
		if *version < 0 {
			return usagef("--version %d: want a positive version, or 0 for the highest", *version)
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.LoadModel(ctx, &brokerv1.LoadModelRequest{Name: args[0], Version: *version})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		m := resp.GetModel()
		did := ""
		switch resp.GetAction() {
		case brokerv1.LoadAction_LOAD_ACTION_UNCHANGED:
			did = " (unchanged: already served from these files)"
		case brokerv1.LoadAction_LOAD_ACTION_RELOADED:
			did = " (reloaded: its files changed)"
		case brokerv1.LoadAction_LOAD_ACTION_SWITCHED:
			did = " (switched from the version served before)"
		}
		return inv.write(fmt.Appendf(nil, "%s version %d %s on %s (%s)%s\n", m.GetName(), m.GetVersion(),
			enumName(m.GetState().Descriptor(), m.GetState().Number()), orDash(strings.Join(m.GetDeviceIds(), ",")),
			humanBytes(m.GetMemoryBytes()), did))
	}
}

func unloadCmd(fs *flag.FlagSet) action {
	asJSON := jsonFlag(fs, "UnloadModelResponse")
	return func(ctx context.Context, inv *invocation, args []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.UnloadModel(ctx, &brokerv1.UnloadModelRequest{Name: args[0]})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		m := resp.GetModel()
		return inv.write(fmt.Appendf(nil, "%s version %d unloaded\n", m.GetName(), m.GetVersion()))
	}
}

// writeModelTable prints one row per model.
func writeModelTable(w io.Writer, ms []*brokerv1.Model, wide bool) error {
	tw := newTable(w)
	header := []string{"NAME", "VERSION", "KIND", "STATE", "DEVICES", "MEMORY", "SIZE", "PARAMS", "QUANT", "VERSIONS"}
	if wide {
		header = append(header, "INPUTS", "OUTPUTS", "LABELS", "ERROR")
	}
	row(tw, "", header...)
	for _, m := range ms {
		var versions []string
		for _, v := range m.GetAvailableVersions() {
			versions = append(versions, strconv.FormatInt(v, 10))
		}
		mem := "-"
		if m.GetMemoryBytes() > 0 {
			mem = humanBytes(m.GetMemoryBytes())
		}
		size := "-"
		if m.GetFileBytes() > 0 {
			size = humanBytes(m.GetFileBytes())
		}
		cells := []string{m.GetName(), strconv.FormatInt(m.GetVersion(), 10), orDash(m.GetKind()),
			enumName(m.GetState().Descriptor(), m.GetState().Number()),
			orDash(strings.Join(m.GetDeviceIds(), ",")), mem, size, orDash(m.GetParameterSize()), orDash(m.GetQuantization()),
			orDash(strings.Join(versions, ","))}
		if wide {
			cells = append(cells, orDash(specsCell(m.GetInputs())), orDash(specsCell(m.GetOutputs())), orDash(labelsCell(m.GetLabels())), orDash(m.GetError()))
		}
		row(tw, "", cells...)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write model table: %w", err)
	}
	return nil
}

// labelsCell prints a classifier's labels in index order, the first
// maxClasses of them and how many more.
func labelsCell(labels []string) string {
	if len(labels) > maxClasses {
		return fmt.Sprintf("%s,... (%d)", strings.Join(labels[:maxClasses], ","), len(labels))
	}
	return strings.Join(labels, ",")
}

// specsCell prints tensor specs as name:DTYPE[shape], e.g. input:FP32[-1,6].
func specsCell(specs []*brokerv1.TensorSpec) string {
	var parts []string
	for _, s := range specs {
		dims := make([]string, len(s.GetShape()))
		for i, d := range s.GetShape() {
			dims[i] = strconv.FormatInt(d, 10)
		}
		parts = append(parts, fmt.Sprintf("%s:%s[%s]", s.GetName(), dtypeName(s.GetDtype()), strings.Join(dims, ",")))
	}
	return strings.Join(parts, " ")
}

// dtypeName is the short name of a data type: FP32, BYTES, ...
func dtypeName(d brokerv1.DataType) string {
	return strings.TrimPrefix(d.String(), "DATA_TYPE_")
}
