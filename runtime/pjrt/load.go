package pjrt

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

// The head of PJRT_Api from xla/pjrt/c/pjrt_c_api.h. Every PJRT C API version
// since 0.45 starts with these fields; the function table that follows is the
// adapter's business.
typedef struct {
	size_t struct_size;
	void* extension_start;
	int major_version;
	int minor_version;
} bd_pjrt_api_version;

typedef struct {
	size_t struct_size;
	void* extension_start;
	bd_pjrt_api_version pjrt_api_version;
} bd_pjrt_api_head;

enum { BD_OK, BD_DLOPEN, BD_NO_SYMBOL, BD_NULL_API, BD_SHORT_API, BD_SHORT_VERSION };

typedef struct {
	int status;
	char* err; // malloc'd dlerror text for BD_DLOPEN
	void* handle;
	const void* api;
	size_t api_size, version_size;
	int major, minor;
} bd_pjrt_load;

// bd_pjrt_open does the whole load in one C call because dlerror's state is
// per thread, and Go may move a goroutine between threads across cgo calls.
static void bd_pjrt_open(const char* path, bd_pjrt_load* r) {
	memset(r, 0, sizeof *r);
	dlerror();
	r->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (r->handle == NULL) {
		const char* e = dlerror();
		r->err = strdup(e != NULL ? e : "unknown error");
		r->status = BD_DLOPEN;
		return;
	}
	void* sym = dlsym(r->handle, "GetPjrtApi");
	if (sym == NULL) {
		r->status = BD_NO_SYMBOL;
		return;
	}
	const bd_pjrt_api_head* api = ((const bd_pjrt_api_head* (*)(void))sym)();
	if (api == NULL) {
		r->status = BD_NULL_API;
		return;
	}
	r->api = api;
	r->api_size = api->struct_size;
	if (r->api_size < sizeof(bd_pjrt_api_head)) {
		r->status = BD_SHORT_API;
		return;
	}
	r->version_size = api->pjrt_api_version.struct_size;
	if (r->version_size < sizeof(bd_pjrt_api_version)) {
		r->status = BD_SHORT_VERSION;
		return;
	}
	r->major = api->pjrt_api_version.major_version;
	r->minor = api->pjrt_api_version.minor_version;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// Load failures, wrapped by the errors of load so callers can tell them apart.
var (
	ErrNotFound  = errors.New("file not found")
	ErrDlopen    = errors.New("dlopen failed")
	ErrNotPlugin = errors.New("no GetPjrtApi symbol: not a PJRT plugin")
	ErrNullAPI   = errors.New("GetPjrtApi returned NULL")
	ErrBadAPI    = errors.New("PJRT_Api too small to hold its version")
)

// library is a plugin loaded into this process.
type library struct {
	handle     unsafe.Pointer // from dlopen; never closed
	api        unsafe.Pointer // const PJRT_Api*, for the adapter
	APIVersion string         // "0.54"
}

type loadResult struct {
	lib *library
	err error
}

// loaded caches load results by real path. It is package state because what
// it mirrors is: dlopen'd libraries belong to the process, and PJRT plugins
// are never unloaded (their threads and static state do not survive
// dlclose), so loading a path a second time must give the first result.
var loaded = struct {
	sync.Mutex
	byPath map[string]loadResult
}{byPath: map[string]loadResult{}}

// load dlopens a PJRT plugin, calls its GetPjrtApi and reads the API version.
// It does not initialise the plugin or create a client: that touches the
// devices, and is the adapter's job.
func load(path string) (*library, error) {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, ErrNotFound
	case err != nil:
		return nil, fmt.Errorf("stat: %w", err)
	case fi.IsDir():
		return nil, errors.New("is a directory, not a plugin library")
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("resolve path: %w", err)
	}

	loaded.Lock()
	defer loaded.Unlock()
	if r, ok := loaded.byPath[real]; ok {
		return r.lib, r.err
	}
	lib, err := open(real)
	if lib != nil {
		// Cached with its error, if any: the handle is open for good, and a
		// second dlopen would only return it again.
		loaded.byPath[real] = loadResult{lib, err}
	}
	if err != nil {
		return nil, err
	}
	return lib, nil
}

// open returns a library whenever dlopen succeeded (with an error when the
// library is not a usable plugin), nil when it failed.
func open(path string) (*library, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var r C.bd_pjrt_load
	C.bd_pjrt_open(cpath, &r)
	if r.status == C.BD_DLOPEN {
		defer C.free(unsafe.Pointer(r.err))
		return nil, fmt.Errorf("%w: %s", ErrDlopen, C.GoString(r.err))
	}
	lib := &library{handle: r.handle, api: unsafe.Pointer(r.api)}
	switch r.status {
	case C.BD_NO_SYMBOL:
		return lib, ErrNotPlugin
	case C.BD_NULL_API:
		return lib, ErrNullAPI
	case C.BD_SHORT_API:
		return lib, fmt.Errorf("%w: struct_size %d", ErrBadAPI, r.api_size)
	case C.BD_SHORT_VERSION:
		return lib, fmt.Errorf("%w: PJRT_Api_Version struct_size %d", ErrBadAPI, r.version_size)
	}
	lib.APIVersion = fmt.Sprintf("%d.%d", int(r.major), int(r.minor))
	return lib, nil
}
