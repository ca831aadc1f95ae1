package cli

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	brokerv1 "github.com/brokerd/brokerd/proto/broker/v1"
)

// action runs a command once its flags are parsed; args are the positional
// arguments.
type action func(ctx context.Context, inv *invocation, args []string) error

// command is one row of brokerctl's command table. Adding a command is adding
// a row and its setup function: setup registers the command's flags and
// returns the action that reads them.
type command struct {
	name     string
	synopsis string // the usage line after "brokerctl "
	summary  string // one line for the command list
	args     string // what the positional arguments are, for errors
	nargs    int    // exact number of positional arguments; -1 for any
	// selfBounded commands end by their own clock (bench's --duration), so
	// --timeout bounds each RPC instead of the whole command.
	selfBounded bool
	// waits: the command's RPC lasts as long as brokerd's own work (a
	// load reading gigabytes, an unload's or a drain's accepted work), so
	// it has no deadline unless --timeout is given.
	waits bool
	setup func(fs *flag.FlagSet) action
}

func commands() []command {
	return []command{
		{name: "health", synopsis: "health [--service NAME] [--json]", summary: "check brokerd's gRPC health; exit 0 only when SERVING", setup: healthCmd},
		{name: "devices", synopsis: "devices [--wide] [--json]", summary: "list every detected device, runnable or not", setup: devicesCmd},
		{name: "device", synopsis: "device ID [--json]", summary: "show every known field of one device (cpu:0, gpu:N, tpu:N, ...)", args: "ID", nargs: 1, setup: deviceCmd},
		{name: "report", synopsis: "report [--verbose] [--json]", summary: "show the routing report: current device, configuration, runtimes, recommendations", setup: reportCmd},
		{name: "batch-plan", synopsis: "batch-plan --base N (--type T | --device ID) [--json]", summary: "show the batch plan for a base batch on a device type or device", setup: batchPlanCmd},
		{name: "cordon", synopsis: "cordon ID [--reason TEXT] [--json]", summary: "stop new batches from going to a device", args: "ID", nargs: 1, setup: cordonCmd},
		{name: "uncordon", synopsis: "uncordon ID [--json]", summary: "let a cordoned device take batches again", args: "ID", nargs: 1, setup: uncordonCmd},
		{name: "encode", synopsis: "encode [TEXT... | - | --file PATH] [--fidelity F] [--model NAME] [--batch N] [--json]", summary: "encode texts (arguments, or one per line from stdin or a file) into vectors and codes", args: "TEXT...", nargs: -1, setup: encodeCmd},
		{name: "stats", synopsis: "stats [--model NAME] [--json]", summary: "show queue, batch and latency statistics per model and device", setup: statsCmd},
		{name: "drain", synopsis: "drain [--exit] [--json]", summary: "stop accepting work and complete everything accepted (then exit with --exit)", waits: true, setup: drainCmd},
		{name: "bench", synopsis: "bench [--concurrency 1,8,64] [--duration 10s] [--baseline] [--json]", summary: "generate closed-loop Encode load and print throughput, latency and batch size per concurrency", selfBounded: true, setup: benchCmd},
		{name: "top", synopsis: "top [--interval 1s] [--model NAME] [--once]", summary: "live view of devices and queues, refreshed like top; q or Ctrl-C quits, --once prints one frame", selfBounded: true, setup: topCmd},
		{name: "models", synopsis: "models [--wide] [--json]", summary: "list the served models and the model repository: versions, state, devices, memory", setup: modelsCmd},
		{name: "load", synopsis: "load NAME [--version V] [--json]", summary: "load (or reload) a repository model onto the devices, admitted against their memory budgets", args: "NAME", nargs: 1, waits: true, setup: loadCmd},
		{name: "unload", synopsis: "unload NAME [--json]", summary: "unload a model once its accepted work is done, freeing its memory", args: "NAME", nargs: 1, waits: true, setup: unloadCmd},
		{name: "infer", synopsis: "infer MODEL --input NAME=@FILE... [--version V] [--output NAME] [--json]", summary: "run typed tensors (JSON files) through a model and print its outputs", args: "MODEL", nargs: 1, setup: inferCmd},
		{name: "generate", synopsis: "generate --model M [--max-tokens N] [--temperature T] [--seed S] [--stop S] [--json-schema FILE | --grammar FILE | --regex RE | --json-object] [--json] PROMPT...", summary: "continue prompts with a generator (LLM) model, streaming the text; several prompts run as one batched round", args: "PROMPT...", nargs: -1, selfBounded: true, setup: generateCmd},
		{name: "chat", synopsis: "chat --model M [--message ROLE=TEXT...] [--system TEXT] [--json-schema FILE | --grammar FILE | --regex RE | --json-object] [--json]", summary: "chat with a generator model through its chat template: interactive, or one answer to --message turns", selfBounded: true, setup: chatCmd},
		{name: "help", synopsis: "help [COMMAND]", summary: "show this list, or one command's flags", args: "[COMMAND]", nargs: -1, setup: helpCmd},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func jsonFlag(fs *flag.FlagSet, what string) *bool {
	return fs.Bool("json", false, "print the "+what+" message as JSON (protojson, snake_case field names)")
}

func healthCmd(fs *flag.FlagSet) action {
	service := fs.String("service", "", "service `NAME` to check: empty for the whole server, or broker.v1.BrokerService")
	asJSON := jsonFlag(fs, "grpc.health.v1.HealthCheckResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		conn, err := inv.dial(ctx)
		if err != nil {
			return err
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: *service})
		if err != nil {
			return err
		}
		if *asJSON {
			err = inv.writeJSON(resp)
		} else {
			err = inv.write([]byte(resp.GetStatus().String() + "\n"))
		}
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return exitStatus(ExitError)
		}
		return nil
	}
}

func devicesCmd(fs *flag.FlagSet) action {
	wide := fs.Bool("wide", false, "add UUID, PCI bus, driver, compute capability, telemetry and why a device is not runnable")
	asJSON := jsonFlag(fs, "ListDevicesResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.ListDevices(ctx, &brokerv1.ListDevicesRequest{})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		if err := writeDeviceTable(&b, resp.GetDevices(), *wide, ""); err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

func deviceCmd(fs *flag.FlagSet) action {
	asJSON := jsonFlag(fs, "GetDeviceResponse")
	return func(ctx context.Context, inv *invocation, args []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.GetDevice(ctx, &brokerv1.GetDeviceRequest{Id: args[0]})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		if err := writeDeviceFields(&b, resp.GetDevice()); err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

func reportCmd(fs *flag.FlagSet) action {
	verbose := fs.Bool("verbose", false, "include batch plans per device type, plugin paths and the wide device table")
	asJSON := jsonFlag(fs, "GetReportResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.GetReport(ctx, &brokerv1.GetReportRequest{Verbose: *verbose})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		if err := writeReport(&b, resp, *verbose); err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

// parseDeviceType maps --type values (the prefixes of device IDs) to the API enum.
func parseDeviceType(s string) (brokerv1.DeviceType, bool) {
	switch strings.ToLower(s) {
	case "cpu":
		return brokerv1.DeviceType_DEVICE_TYPE_CPU, true
	case "gpu":
		return brokerv1.DeviceType_DEVICE_TYPE_GPU, true
	case "tpu":
		return brokerv1.DeviceType_DEVICE_TYPE_TPU, true
	case "amdgpu":
		return brokerv1.DeviceType_DEVICE_TYPE_AMD_GPU, true
	case "edgetpu":
		return brokerv1.DeviceType_DEVICE_TYPE_EDGE_TPU, true
	}
	return brokerv1.DeviceType_DEVICE_TYPE_UNSPECIFIED, false
}

func batchPlanCmd(fs *flag.FlagSet) action {
	var base int32
	baseSet := false
	fs.Func("base", "base batch size `N` (required; the server rejects N <= 0 and absurd sizes)", func(s string) error {
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return fmt.Errorf("not a 32-bit integer: %q", s)
		}
		base, baseSet = int32(n), true
		return nil
	})
	typ := fs.String("type", "", "device type `T`: cpu|gpu|tpu|amdgpu|edgetpu")
	device := fs.String("device", "", "device `ID`, e.g. gpu:0")
	asJSON := jsonFlag(fs, "GetBatchPlanResponse")
	return func(ctx context.Context, inv *invocation, _ []string) error {
		if !baseSet {
			return usagef("--base is required")
		}
		req := &brokerv1.GetBatchPlanRequest{BaseBatch: base}
		switch {
		case (*typ == "") == (*device == ""):
			return usagef("exactly one of --type or --device is required")
		case *typ != "":
			t, ok := parseDeviceType(*typ)
			if !ok {
				return usagef("--type %q: want cpu, gpu, tpu, amdgpu or edgetpu", *typ)
			}
			req.Target = &brokerv1.GetBatchPlanRequest_DeviceType{DeviceType: t}
		default:
			req.Target = &brokerv1.GetBatchPlanRequest_DeviceId{DeviceId: *device}
		}
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.GetBatchPlan(ctx, req)
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		var b bytes.Buffer
		if err := writeBatchPlan(&b, resp.GetPlan()); err != nil {
			return err
		}
		return inv.write(b.Bytes())
	}
}

func cordonCmd(fs *flag.FlagSet) action {
	reason := fs.String("reason", "", "`TEXT` saying why the device is cordoned")
	asJSON := jsonFlag(fs, "CordonDeviceResponse")
	return func(ctx context.Context, inv *invocation, args []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.CordonDevice(ctx, &brokerv1.CordonDeviceRequest{Id: args[0], Reason: *reason})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		return writeDeviceState(inv, resp.GetDevice())
	}
}

func uncordonCmd(fs *flag.FlagSet) action {
	asJSON := jsonFlag(fs, "UncordonDeviceResponse")
	return func(ctx context.Context, inv *invocation, args []string) error {
		c, err := inv.broker(ctx)
		if err != nil {
			return err
		}
		resp, err := c.UncordonDevice(ctx, &brokerv1.UncordonDeviceRequest{Id: args[0]})
		if err != nil {
			return err
		}
		if *asJSON {
			return inv.writeJSON(resp)
		}
		return writeDeviceState(inv, resp.GetDevice())
	}
}

// writeDeviceState prints a device's row of the devices table and, when it is
// cordoned, why.
func writeDeviceState(inv *invocation, d *brokerv1.Device) error {
	var b bytes.Buffer
	if err := writeDeviceTable(&b, []*brokerv1.Device{d}, false, ""); err != nil {
		return err
	}
	if d.GetCordoned() && d.GetCordonReason() != "" {
		fmt.Fprintf(&b, "cordon reason: %s\n", d.GetCordonReason())
	}
	return inv.write(b.Bytes())
}

func helpCmd(_ *flag.FlagSet) action {
	return func(_ context.Context, inv *invocation, args []string) error {
		switch len(args) {
		case 0:
			return inv.write([]byte(mainUsage(inv.defaultSocket)))
		case 1:
			c, ok := lookup(args[0])
			if !ok {
				return usageError{msg: unknownCommand(args[0]), oneLine: true}
			}
			fs := newFlagSet("brokerctl " + c.name)
			c.setup(fs)
			return inv.write([]byte(commandUsage(c, fs)))
		default:
			return usagef("want at most one command name, got %d", len(args))
		}
	}
}
