package detect

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// Sentinel errors. Callers wrap them with details; the gRPC server maps them
// to status codes with errors.Is.
var (
	// ErrDeviceNotFound: no device has the requested ID (or type).
	ErrDeviceNotFound = errors.New("device not found")
	// ErrDeviceUnavailable: the device exists but cannot take work now.
	ErrDeviceUnavailable = errors.New("device unavailable")
	// ErrDeviceCordoned is the ErrDeviceUnavailable case of an admin cordon;
	// it wraps ErrDeviceUnavailable so either check matches.
	ErrDeviceCordoned = fmt.Errorf("%w: cordoned", ErrDeviceUnavailable)
	// ErrInvalidArgument: a setting or request value is out of range.
	ErrInvalidArgument = errors.New("invalid argument")
)

// Prefer is the COMPUTE_PREFER setting.
type Prefer string

// Preferences.
const (
	PreferAuto Prefer = "auto"
	PreferCPU  Prefer = "cpu"
	PreferGPU  Prefer = "gpu"
	PreferTPU  Prefer = "tpu"
)

// ParsePrefer parses COMPUTE_PREFER. Case and surrounding space are ignored;
// the empty string means auto (the setting is unset).
func ParsePrefer(s string) (Prefer, error) {
	switch p := Prefer(strings.ToLower(strings.TrimSpace(s))); p {
	case "":
		return PreferAuto, nil
	case PreferAuto, PreferCPU, PreferGPU, PreferTPU:
		return p, nil
	default:
		return "", fmt.Errorf("invalid prefer %q: want one of auto, cpu, gpu, tpu: %w", s, ErrInvalidArgument)
	}
}

// ParseType parses a device type name as used in IDs and requests.
func ParseType(s string) (Type, error) {
	switch t := Type(strings.ToLower(strings.TrimSpace(s))); t {
	case TypeCPU, TypeGPU, TypeTPU, TypeAMDGPU, TypeEdgeTPU:
		return t, nil
	default:
		return "", fmt.Errorf("invalid device type %q: want one of cpu, gpu, tpu, amdgpu, edgetpu: %w", s, ErrInvalidArgument)
	}
}

// Policy is the selection configuration.
type Policy struct {
	Prefer   Prefer
	AllowTPU bool
}

// Selection is the device the policy picked and how it got there.
type Selection struct {
	// Device is nil only when no device at all can take work.
	Device *Device
	// Reason says in plain words why each step of the chain was skipped.
	Reason string
	// Chain is the types tried, in order, ending with the chosen one.
	Chain []Type
	// Mode is "auto" (COMPUTE_PREFER=auto) or "manual".
	Mode string
}

// fallbackOrder is the auto order and the fallback chain below a preference.
var fallbackOrder = [...]Type{TypeTPU, TypeGPU, TypeCPU}

func chainFor(p Prefer) []Type {
	switch p {
	case PreferCPU:
		return []Type{TypeCPU}
	case PreferGPU:
		return []Type{TypeGPU, TypeCPU}
	default: // auto and tpu walk the whole chain
		return fallbackOrder[:]
	}
}

func typeLabel(t Type) string { return strings.ToUpper(string(t)) }

// deviceLabel names d in reasons, also before the registry assigned an ID.
func deviceLabel(d *Device) string {
	if d.ID != "" {
		return d.ID
	}
	return string(d.Type) + ":" + strconv.Itoa(d.Index)
}

// idNumber orders devices of one type: the number of the stable ID, else the
// enumeration index.
func idNumber(d *Device) int {
	if i := strings.LastIndexByte(d.ID, ':'); i >= 0 {
		if n, err := strconv.Atoi(d.ID[i+1:]); err == nil {
			return n
		}
	}
	return d.Index
}

// unusableReason says why d cannot take work, or "" when it can. TPU
// permission is checked by the caller because it concerns the whole type.
func unusableReason(d *Device, cordons map[string]string) string {
	label := deviceLabel(d)
	if !d.Runnable() {
		why := d.RuntimeReason
		if why == "" {
			why = "no runtime adapter can drive it"
		}
		return label + " has no runtime: " + why
	}
	if d.Health == Unhealthy {
		if d.HealthReason != "" {
			return label + " is unhealthy: " + d.HealthReason
		}
		return label + " is unhealthy"
	}
	if why, ok := cordons[d.ID]; ok {
		if why != "" {
			return label + " is cordoned: " + why
		}
		return label + " is cordoned"
	}
	return ""
}

// pickOfType returns the usable device of type t with the lowest index and
// why the lower ones were passed over, or nil and a phrase saying why there is
// none.
func pickOfType(devs []Device, t Type, p Policy, cordons map[string]string) (*Device, []string, string) {
	var cands []*Device
	for i := range devs {
		if devs[i].Type == t {
			cands = append(cands, &devs[i])
		}
	}
	if len(cands) == 0 {
		return nil, nil, "no " + typeLabel(t) + " present"
	}
	if t == TypeTPU && !p.AllowTPU {
		return nil, nil, "COMPUTE_ALLOW_TPU=false"
	}
	sort.SliceStable(cands, func(i, j int) bool { return idNumber(cands[i]) < idNumber(cands[j]) })
	var why []string
	for _, d := range cands {
		r := unusableReason(d, cordons)
		if r == "" {
			return d, why, ""
		}
		why = append(why, r)
	}
	return nil, nil, "no runnable " + typeLabel(t) + " (" + strings.Join(why, "; ") + ")"
}

// Select picks the device that work goes to when a request pins nothing:
// the preferred type first, then the fallback chain TPU → GPU → CPU below it,
// skipping devices no runtime can drive, unhealthy devices and (unless
// allowed) TPUs. Selection.Device points into devs. It knows nothing of
// cordons; Inventory.Select honours them.
func Select(devs []Device, p Policy) Selection {
	return selectDevice(devs, p, nil)
}

func selectDevice(devs []Device, p Policy, cordons map[string]string) Selection {
	prefer := p.Prefer
	if prefer == "" {
		prefer = PreferAuto
	}
	sel := Selection{Mode: "manual"}
	var steps []string
	if prefer == PreferAuto {
		sel.Mode = "auto"
		steps = append(steps, "auto (TPU > GPU > CPU)")
	}
	chain := chainFor(prefer)
	for i, t := range chain {
		sel.Chain = append(sel.Chain, t)
		d, passed, why := pickOfType(devs, t, p, cordons)
		if d != nil {
			if len(steps) == 0 {
				steps = append(steps, "prefer="+string(prefer))
			}
			steps = append(steps, passed...)
			sel.Device = d
			sel.Reason = strings.Join(steps, "; ") + "; using " + deviceLabel(d)
			return sel
		}
		switch {
		case i == 0 && prefer != PreferAuto:
			why = "prefer=" + string(prefer) + " but " + why
		case why == "COMPUTE_ALLOW_TPU=false":
			why = "TPU skipped: " + why
		}
		steps = append(steps, why)
	}
	// "Nothing runnable" means nothing at all: a preference never strands work
	// while some other device could run it.
	for _, t := range fallbackOrder {
		if containsType(chain, t) {
			continue
		}
		if d, _, _ := pickOfType(devs, t, p, cordons); d != nil {
			sel.Chain = append(sel.Chain, t)
			sel.Device = d
			sel.Reason = strings.Join(steps, "; ") + "; using " + deviceLabel(d) + " outside the preferred chain"
			return sel
		}
	}
	sel.Reason = strings.Join(steps, "; ") + "; no runnable device"
	return sel
}

func containsType(ts []Type, t Type) bool {
	for _, x := range ts {
		if x == t {
			return true
		}
	}
	return false
}

// SelectFor resolves a request that may pin a device ID or a device type; with
// neither it is Select. Errors wrap ErrDeviceNotFound (unknown ID, or no device
// of the type), ErrDeviceUnavailable (present but not runnable, unhealthy or
// not allowed) or ErrInvalidArgument (unknown type, ID of another type).
// Cordons are not known here; Inventory.SelectFor honours them.
func SelectFor(devs []Device, p Policy, pinType Type, pinID string) (*Device, error) {
	return selectFor(devs, p, nil, pinType, pinID)
}

func selectFor(devs []Device, p Policy, cordons map[string]string, pinType Type, pinID string) (*Device, error) {
	if pinType != "" {
		if _, err := ParseType(string(pinType)); err != nil {
			return nil, err
		}
	}
	if pinID != "" {
		var d *Device
		for i := range devs {
			if devs[i].ID == pinID {
				d = &devs[i]
				break
			}
		}
		if d == nil {
			return nil, fmt.Errorf("device %q: %w", pinID, ErrDeviceNotFound)
		}
		if pinType != "" && d.Type != pinType {
			return nil, fmt.Errorf("device %s is a %s, not a %s: %w", pinID, d.Type, pinType, ErrInvalidArgument)
		}
		if d.Type == TypeTPU && !p.AllowTPU {
			return nil, fmt.Errorf("device %s: COMPUTE_ALLOW_TPU=false: %w", pinID, ErrDeviceUnavailable)
		}
		if why := unusableReason(d, nil); why != "" {
			return nil, fmt.Errorf("%s: %w", why, ErrDeviceUnavailable)
		}
		if why := unusableReason(d, cordons); why != "" {
			return nil, fmt.Errorf("%s: %w", why, ErrDeviceCordoned)
		}
		return d, nil
	}
	if pinType != "" {
		d, _, why := pickOfType(devs, pinType, p, cordons)
		if d != nil {
			return d, nil
		}
		if strings.HasPrefix(why, "no "+typeLabel(pinType)+" present") {
			return nil, fmt.Errorf("no %s device on this host: %w", pinType, ErrDeviceNotFound)
		}
		return nil, fmt.Errorf("%s: %w", why, ErrDeviceUnavailable)
	}
	sel := selectDevice(devs, p, cordons)
	if sel.Device == nil {
		return nil, fmt.Errorf("%s: %w", sel.Reason, ErrDeviceUnavailable)
	}
	return sel.Device, nil
}

// Batch plan limits: a base above MaxBaseBatch or a plan above MaxPlanBatch
// is a mistake, not a workload.
const (
	MaxBaseBatch = 4096
	MaxPlanBatch = 1 << 20
)

// Factors multiply the base batch per device type (COMPUTE_TPU_BATCH_FACTOR,
// --gpu-batch-factor, --cpu-batch-factor). A zero factor means the default.
type Factors struct{ TPU, GPU, CPU int }

// DefaultFactors are the design's factors.
func DefaultFactors() Factors { return Factors{TPU: 128, GPU: 4, CPU: 1} }

// BatchPlan is how work of one base batch size is batched on a device type.
type BatchPlan struct {
	Type     Type
	DeviceID string // set by callers planning for one device; empty for a type
	Base     int
	Factor   int
	Min, Max int
	// Buckets are the padded batch sizes: powers of two up to Max, and Max.
	Buckets []int
}

// PlanBatch plans batches for type t: Max = base × factor, rounded for TPUs to
// the nearest power of two (ties up) because XLA compiles one program per
// shape. It does not need a device of type t to be present.
func PlanBatch(base int, t Type, f Factors) (BatchPlan, error) {
	if base <= 0 || base > MaxBaseBatch {
		return BatchPlan{}, fmt.Errorf("invalid base batch %d: want 1 to %d: %w", base, MaxBaseBatch, ErrInvalidArgument)
	}
	def := DefaultFactors()
	var factor, dflt int
	switch t {
	case TypeTPU:
		factor, dflt = f.TPU, def.TPU
	case TypeGPU:
		factor, dflt = f.GPU, def.GPU
	case TypeCPU:
		factor, dflt = f.CPU, def.CPU
	case TypeAMDGPU, TypeEdgeTPU:
		return BatchPlan{}, fmt.Errorf("no batch plan for %s: %s: %w", t, NoAdapterReason, ErrInvalidArgument)
	default:
		return BatchPlan{}, fmt.Errorf("invalid device type %q: want one of cpu, gpu, tpu: %w", t, ErrInvalidArgument)
	}
	if factor == 0 {
		factor = dflt
	}
	if factor < 0 || factor > MaxPlanBatch {
		return BatchPlan{}, fmt.Errorf("invalid %s batch factor %d: want 1 to %d: %w", t, factor, MaxPlanBatch, ErrInvalidArgument)
	}
	// Both are bounded above, so the product fits an int.
	maxBatch := base * factor
	if t == TypeTPU {
		maxBatch = nearestPow2(maxBatch)
	}
	if maxBatch > MaxPlanBatch {
		return BatchPlan{}, fmt.Errorf("batch plan for %s: base %d × factor %d gives max batch %d, above %d: %w",
			t, base, factor, maxBatch, MaxPlanBatch, ErrInvalidArgument)
	}
	plan := BatchPlan{Type: t, Base: base, Factor: factor, Min: 1, Max: maxBatch}
	for b := 1; b <= maxBatch; b *= 2 {
		plan.Buckets = append(plan.Buckets, b)
	}
	if !isPow2(maxBatch) {
		plan.Buckets = append(plan.Buckets, maxBatch)
	}
	return plan, nil
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// nearestPow2 rounds n > 0 to the nearest power of two; a tie goes up.
func nearestPow2(n int) int {
	if isPow2(n) {
		return n
	}
	lo := 1 << (bits.Len(uint(n)) - 1)
	hi := lo << 1
	if n-lo < hi-n {
		return lo
	}
	return hi
}

// MemoryStrategy is the fraction of a device's memory brokerd admits model
// loads and batch workspace against.
type MemoryStrategy struct {
	Name     string // conservative, balanced, aggressive or custom
	Fraction float64
}

// Named memory strategies.
var (
	MemoryConservative = MemoryStrategy{Name: "conservative", Fraction: 0.60}
	MemoryBalanced     = MemoryStrategy{Name: "balanced", Fraction: 0.75}
	MemoryAggressive   = MemoryStrategy{Name: "aggressive", Fraction: 0.90}
)

// ParseMemoryStrategy parses --memory-strategy: a name, or a fraction in
// (0, 1]. The empty string is the default, balanced.
func ParseMemoryStrategy(s string) (MemoryStrategy, error) {
	switch v := strings.ToLower(strings.TrimSpace(s)); v {
	case "", MemoryBalanced.Name:
		return MemoryBalanced, nil
	case MemoryConservative.Name:
		return MemoryConservative, nil
	case MemoryAggressive.Name:
		return MemoryAggressive, nil
	default:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 1 {
			return MemoryStrategy{}, fmt.Errorf("invalid memory strategy %q: want conservative, balanced, aggressive or a fraction in (0, 1]: %w",
				s, ErrInvalidArgument)
		}
		return MemoryStrategy{Name: "custom", Fraction: f}, nil
	}
}

// String is "balanced (0.75)".
func (m MemoryStrategy) String() string {
	return m.Name + " (" + strconv.FormatFloat(m.Fraction, 'g', -1, 64) + ")"
}

// Budget is the part of total bytes brokerd may use.
func (m MemoryStrategy) Budget(total uint64) uint64 {
	if m.Fraction >= 1 {
		return total
	}
	if m.Fraction <= 0 {
		return 0
	}
	return uint64(float64(total) * m.Fraction)
}

// CostTable prices devices in dollars per hour.
type CostTable struct {
	PerType map[Type]float64
	// PerName overrides PerType for a device model name ("NVIDIA H100 80GB HBM3").
	PerName map[string]float64
}

// DefaultCostTable is the design's prices: CPU 0.00, GPU 0.50, TPU 2.00.
func DefaultCostTable() CostTable {
	return CostTable{
		PerType: map[Type]float64{TypeCPU: 0, TypeGPU: 0.50, TypeTPU: 2.00},
		PerName: map[string]float64{},
	}
}

// PerHour is d's price: its model name's price, else its type's, else 0.
func (c CostTable) PerHour(d *Device) float64 {
	if v, ok := c.PerName[d.Name]; ok && d.Name != "" {
		return v
	}
	return c.PerType[d.Type]
}

// Clone copies the maps so the copy can be changed independently.
func (c CostTable) Clone() CostTable {
	out := CostTable{PerType: make(map[Type]float64, len(c.PerType)), PerName: make(map[string]float64, len(c.PerName))}
	for k, v := range c.PerType {
		out.PerType[k] = v
	}
	for k, v := range c.PerName {
		out.PerName[k] = v
	}
	return out
}

// ParseCostOverrides applies a setting like
// "gpu=0.9,tpu=3.1,NVIDIA H100 80GB HBM3=4.5" to the default table: a key
// that is a device type sets that type's price, any other key a model name's.
// The last '=' splits key and value, so names may contain '='.
func ParseCostOverrides(s string) (CostTable, error) {
	c := DefaultCostTable()
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		i := strings.LastIndexByte(item, '=')
		if i <= 0 {
			return CostTable{}, fmt.Errorf("invalid cost override %q: want KEY=DOLLARS_PER_HOUR: %w", item, ErrInvalidArgument)
		}
		key, val := strings.TrimSpace(item[:i]), strings.TrimSpace(item[i+1:])
		v, err := strconv.ParseFloat(val, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return CostTable{}, fmt.Errorf("invalid cost override %q: price must be a number ≥ 0: %w", item, ErrInvalidArgument)
		}
		if t, err := ParseType(key); err == nil {
			c.PerType[t] = v
		} else {
			c.PerName[key] = v
		}
	}
	return c, nil
}

// CostShare is the cost of items out of a batch of batchItems that held a
// device priced perHour for deviceSeconds.
func CostShare(perHour float64, deviceSeconds float64, items, batchItems int) float64 {
	if items <= 0 || batchItems <= 0 || deviceSeconds <= 0 || perHour <= 0 {
		return 0
	}
	return perHour / 3600 * deviceSeconds * float64(items) / float64(batchItems)
}
