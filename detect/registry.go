package detect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// RegistryFile is the registry's file name in the state dir.
const RegistryFile = "devices.json"

const registryVersion = 1

// Registry remembers which stable ID each physical device (Device.StableKey)
// got, so IDs survive restarts and re-enumeration. A device missing at one
// discovery keeps its ID reserved for when it comes back.
type Registry struct {
	mu   sync.Mutex
	path string // empty: in memory only
	log  *zap.Logger
	ids  map[string]string // stable key → ID
	// names are the last model names seen, written for people reading the file.
	names map[string]string // stable key → name
}

type registryFileV1 struct {
	Version int             `json:"version"`
	Devices []registryEntry `json:"devices"`
}

type registryEntry struct {
	Key  string `json:"key"`
	ID   string `json:"id"`
	Name string `json:"name,omitempty"` // for people reading the file
}

// OpenRegistry loads dir/devices.json, creating dir if needed. An empty dir
// keeps the registry in memory only. A file that cannot be parsed is moved
// aside to devices.json.corrupt-<unix seconds> and the registry starts empty.
func OpenRegistry(dir string, log *zap.Logger) (*Registry, error) {
	if log == nil {
		log = zap.NewNop()
	}
	r := &Registry{log: log, ids: map[string]string{}, names: map[string]string{}}
	if dir == "" {
		return r, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("registry: create state dir: %w", err)
	}
	r.path = filepath.Join(dir, RegistryFile)
	data, err := os.ReadFile(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("registry: %w", err)
	}
	ids, names, perr := parseRegistry(data)
	if perr == nil {
		r.ids, r.names = ids, names
		return r, nil
	}
	aside := r.path + ".corrupt-" + strconv.FormatInt(time.Now().Unix(), 10)
	if err := os.Rename(r.path, aside); err != nil {
		return nil, fmt.Errorf("registry: move corrupt %s aside: %w (corrupt because: %v)", r.path, err, perr)
	}
	log.Warn("device registry is corrupt; moved it aside and rebuilding it, device IDs may change",
		zap.String("path", r.path), zap.String("moved_to", aside), zap.Error(perr))
	return r, nil
}

// parseRegistry checks every entry: a registry that would hand one ID to two
// devices is worse than none.
func parseRegistry(data []byte) (ids, names map[string]string, err error) {
	var f registryFileV1
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, nil, err
	}
	if f.Version != registryVersion {
		return nil, nil, fmt.Errorf("unsupported version %d", f.Version)
	}
	ids = make(map[string]string, len(f.Devices))
	names = make(map[string]string, len(f.Devices))
	seen := make(map[string]bool, len(f.Devices))
	for _, e := range f.Devices {
		if e.Key == "" {
			return nil, nil, fmt.Errorf("entry for %q has no key", e.ID)
		}
		if _, _, ok := splitDeviceID(e.ID); !ok {
			return nil, nil, fmt.Errorf("entry %q has a malformed ID %q", e.Key, e.ID)
		}
		if _, dup := ids[e.Key]; dup {
			return nil, nil, fmt.Errorf("key %q appears twice", e.Key)
		}
		if seen[e.ID] {
			return nil, nil, fmt.Errorf("ID %q appears twice", e.ID)
		}
		ids[e.Key], seen[e.ID] = e.ID, true
		if e.Name != "" {
			names[e.Key] = e.Name
		}
	}
	return ids, names, nil
}

// splitDeviceID splits "gpu:3" into its type and number.
func splitDeviceID(id string) (Type, int, bool) {
	i := strings.LastIndexByte(id, ':')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 0 || strconv.Itoa(n) != id[i+1:] {
		return "", 0, false
	}
	return Type(id[:i]), n, true
}

// Lookup returns the ID reserved for a stable key.
func (r *Registry) Lookup(key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.ids[key]
	return id, ok
}

// Assign sets every device's ID: a known device keeps its ID, a new one gets
// the lowest free number of its type (new devices are numbered in their
// enumeration order, so a first start matches NVML and chip indexes). The
// registry is persisted when it changed; on a write error the IDs are still
// set and the error is returned.
func (r *Registry) Assign(devs []Device) error {
	r.mu.Lock()
	defer r.mu.Unlock()

	used := make(map[string]bool, len(r.ids)+len(devs))
	for _, id := range r.ids {
		used[id] = true
	}
	claimed := make(map[string]bool, len(devs)) // keys given out this round
	var fresh []int
	for i := range devs {
		d := &devs[i]
		key := d.StableKey()
		if id, ok := r.ids[key]; ok && !claimed[key] {
			if t, _, _ := splitDeviceID(id); t == d.Type {
				d.ID = id
				claimed[key] = true
				continue
			}
		}
		fresh = append(fresh, i)
	}
	sort.SliceStable(fresh, func(a, b int) bool {
		da, db := &devs[fresh[a]], &devs[fresh[b]]
		if da.Type != db.Type {
			return da.Type < db.Type
		}
		return da.Index < db.Index
	})
	changed := false
	for _, i := range fresh {
		d := &devs[i]
		id := lowestFreeID(d.Type, used)
		used[id] = true
		d.ID = id
		key := d.StableKey()
		if claimed[key] {
			// Two devices reported the same identity: give the second an
			// ID for this run but do not let it steal the reservation.
			r.log.Warn("two devices share one stable key; the second gets an unreserved ID",
				zap.String("key", key), zap.String("id", id))
			continue
		}
		if old, ok := r.ids[key]; ok {
			r.log.Warn("device changed type; reassigning its ID",
				zap.String("key", key), zap.String("old_id", old), zap.String("id", id))
		}
		claimed[key] = true
		r.ids[key] = id
		changed = true
	}
	for i := range devs {
		if key := devs[i].StableKey(); devs[i].Name != "" && r.ids[key] == devs[i].ID {
			r.names[key] = devs[i].Name
		}
	}
	if !changed || r.path == "" {
		return nil
	}
	return r.persistLocked()
}

func lowestFreeID(t Type, used map[string]bool) string {
	for n := 0; ; n++ {
		if id := string(t) + ":" + strconv.Itoa(n); !used[id] {
			return id
		}
	}
}

// persistLocked writes the registry atomically: a temp file in the same dir,
// fsync, rename over the old one, then fsync the dir so the rename survives
// a crash.
func (r *Registry) persistLocked() error {
	f := registryFileV1{Version: registryVersion, Devices: make([]registryEntry, 0, len(r.ids))}
	for key, id := range r.ids {
		f.Devices = append(f.Devices, registryEntry{Key: key, ID: id, Name: r.names[key]})
	}
	sort.Slice(f.Devices, func(i, j int) bool {
		ti, ni, _ := splitDeviceID(f.Devices[i].ID)
		tj, nj, _ := splitDeviceID(f.Devices[j].ID)
		if ti != tj {
			return ti < tj
		}
		return ni < nj
	})
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("registry: encode: %w", err)
	}
	data = append(data, '\n')

	dir := filepath.Dir(r.path)
	tmp, err := os.CreateTemp(dir, RegistryFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("registry: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("registry: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("registry: close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), r.path); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("registry: open state dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("registry: sync state dir: %w", err)
	}
	return nil
}
