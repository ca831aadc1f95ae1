package pjrt

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include <string.h>
#include "pjrt_c_api.h"

// The PJRT functions brokerd reaches through go-xla (plugin set-up, client,
// devices, compile, execute, buffers, events) and through bd_describe. go-xla
// calls them without checking, so a plugin whose table is shorter than
// go-xla's header, or that leaves one NULL, would crash the daemon: checked
// first, by bd_missing.
#define BD_REQUIRED(X) \
	X(PJRT_Error_Destroy) X(PJRT_Error_Message) X(PJRT_Error_GetCode) \
	X(PJRT_Plugin_Initialize) X(PJRT_Plugin_Attributes) \
	X(PJRT_Event_Destroy) X(PJRT_Event_Await) \
	X(PJRT_Client_Create) X(PJRT_Client_Destroy) X(PJRT_Client_PlatformName) \
	X(PJRT_Client_PlatformVersion) X(PJRT_Client_ProcessIndex) \
	X(PJRT_Client_AddressableDevices) X(PJRT_Client_Compile) \
	X(PJRT_Client_BufferFromHostBuffer) \
	X(PJRT_DeviceDescription_Id) X(PJRT_DeviceDescription_ProcessIndex) \
	X(PJRT_DeviceDescription_Attributes) X(PJRT_DeviceDescription_Kind) \
	X(PJRT_DeviceDescription_DebugString) \
	X(PJRT_Device_GetDescription) X(PJRT_Device_LocalHardwareId) X(PJRT_Device_IsAddressable) \
	X(PJRT_LoadedExecutable_Destroy) X(PJRT_LoadedExecutable_GetExecutable) \
	X(PJRT_LoadedExecutable_Execute) \
	X(PJRT_Executable_Destroy) X(PJRT_Executable_Name) X(PJRT_Executable_NumOutputs) \
	X(PJRT_Executable_GetCompiledMemoryStats) \
	X(PJRT_Buffer_Destroy) X(PJRT_Buffer_ToHostBuffer) X(PJRT_Buffer_Dimensions) \
	X(PJRT_Buffer_ElementType)

// bd_missing returns the name of the first required function the table
// lacks (beyond its struct_size, or NULL), or NULL when it has them all.
static const char* bd_missing(const void* p) {
	const PJRT_Api* api = p;
#define BD_CHECK(fn) \
	if (api->struct_size < offsetof(PJRT_Api, fn) + sizeof(void*) || api->fn == NULL) return #fn;
	BD_REQUIRED(BD_CHECK)
#undef BD_CHECK
	return NULL;
}

// bd_error_text returns err's message (malloc'd) and destroys err.
static char* bd_error_text(const PJRT_Api* api, PJRT_Error* err) {
	PJRT_Error_Message_Args m;
	memset(&m, 0, sizeof m);
	m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
	m.error = err;
	api->PJRT_Error_Message(&m);
	char* text = malloc(m.message_size + 1);
	if (text != NULL) {
		if (m.message != NULL) memcpy(text, m.message, m.message_size);
		text[m.message != NULL ? m.message_size : 0] = 0;
	}
	PJRT_Error_Destroy_Args d;
	memset(&d, 0, sizeof d);
	d.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
	d.error = err;
	api->PJRT_Error_Destroy(&d);
	return text;
}

typedef struct {
	int id;
	const char* kind;
	size_t kind_size;
	const PJRT_NamedValue* attrs; // owned by the device
	size_t num_attrs;
	const char* step; // what failed
	char* err;        // malloc'd message when a call failed
} bd_desc;

// bd_describe reads the id, kind and attributes of a device: what go-xla
// v0.3.0 does not wrap, and brokerd needs to match PJRT devices to the
// GPUs and TPUs it detected.
static void bd_describe(const void* p, void* device, bd_desc* out) {
	const PJRT_Api* api = p;
	memset(out, 0, sizeof *out);
	PJRT_Device_GetDescription_Args g;
	memset(&g, 0, sizeof g);
	g.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
	g.device = device;
	PJRT_Error* e = api->PJRT_Device_GetDescription(&g);
	if (e != NULL) { out->step = "PJRT_Device_GetDescription"; out->err = bd_error_text(api, e); return; }

	PJRT_DeviceDescription_Id_Args i;
	memset(&i, 0, sizeof i);
	i.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
	i.device_description = g.device_description;
	if ((e = api->PJRT_DeviceDescription_Id(&i)) != NULL) { out->step = "PJRT_DeviceDescription_Id"; out->err = bd_error_text(api, e); return; }
	out->id = i.id;

	PJRT_DeviceDescription_Kind_Args k;
	memset(&k, 0, sizeof k);
	k.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
	k.device_description = g.device_description;
	if ((e = api->PJRT_DeviceDescription_Kind(&k)) != NULL) { out->step = "PJRT_DeviceDescription_Kind"; out->err = bd_error_text(api, e); return; }
	out->kind = k.device_kind;
	out->kind_size = k.device_kind_size;

	PJRT_DeviceDescription_Attributes_Args a;
	memset(&a, 0, sizeof a);
	a.struct_size = PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE;
	a.device_description = g.device_description;
	if ((e = api->PJRT_DeviceDescription_Attributes(&a)) != NULL) { out->step = "PJRT_DeviceDescription_Attributes"; out->err = bd_error_text(api, e); return; }
	out->attrs = a.attributes;
	out->num_attrs = a.num_attributes;
}

static const PJRT_NamedValue* bd_attr(const PJRT_NamedValue* attrs, size_t i) { return &attrs[i]; }
static int bd_attr_type(const PJRT_NamedValue* v) { return (int)v->type; }
static const char* bd_attr_string(const PJRT_NamedValue* v) { return v->string_value; }
static int64_t bd_attr_int64(const PJRT_NamedValue* v) { return v->int64_value; }
static const int64_t* bd_attr_int64s(const PJRT_NamedValue* v) { return v->int64_array_value; }
static float bd_attr_float(const PJRT_NamedValue* v) { return v->float_value; }
static int bd_attr_bool(const PJRT_NamedValue* v) { return v->bool_value ? 1 : 0; }
*/
import "C"

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unsafe"

	xpjrt "github.com/gomlx/go-xla/pjrt"
)

// ErrIncompleteAPI means a plugin's function table lacks a function brokerd
// calls: too old a plugin, or not a complete PJRT implementation.
var ErrIncompleteAPI = errors.New("PJRT plugin lacks a required function")

// checkAPI refuses a function table brokerd cannot use without crashing.
func checkAPI(api unsafe.Pointer) error {
	if api == nil {
		return ErrNullAPI
	}
	if fn := C.bd_missing(api); fn != nil {
		return fmt.Errorf("%w: %s", ErrIncompleteAPI, C.GoString(fn))
	}
	return nil
}

// devicePointer returns the PJRT_Device* behind a go-xla Device. go-xla
// v0.3.0 keeps it unexported and does not wrap the device's kind, id or
// attributes; TestGoXLADeviceLayout fails if an upgrade moves the field.
func devicePointer(d *xpjrt.Device) (unsafe.Pointer, error) {
	if d == nil {
		return nil, errors.New("nil device")
	}
	f := reflect.ValueOf(d).Elem().FieldByName("cDevice")
	if !f.IsValid() || f.Kind() != reflect.Pointer {
		return nil, errors.New("go-xla's pjrt.Device has no cDevice pointer field: the go-xla version differs from v0.3.0")
	}
	p := unsafe.Pointer(f.Pointer())
	if p == nil {
		return nil, errors.New("device has a NULL PJRT_Device")
	}
	return p, nil
}

// describe reads a device's id, kind and attributes through the plugin's
// function table.
func describe(api unsafe.Pointer, dev *xpjrt.Device) (id int, kind string, attrs map[string]string, err error) {
	p, err := devicePointer(dev)
	if err != nil {
		return 0, "", nil, err
	}
	var d C.bd_desc
	C.bd_describe(api, p, &d)
	if d.err != nil {
		defer C.free(unsafe.Pointer(d.err))
		return 0, "", nil, fmt.Errorf("%s: %s", C.GoString(d.step), C.GoString(d.err))
	}
	if d.kind != nil {
		kind = C.GoStringN(d.kind, C.int(d.kind_size))
	}
	attrs = map[string]string{}
	for i := C.size_t(0); i < d.num_attrs; i++ {
		v := C.bd_attr(d.attrs, i)
		name := C.GoStringN(v.name, C.int(v.name_size))
		attrs[name] = attrValue(v)
	}
	return int(d.id), kind, attrs, nil
}

// attrValue formats a named value: lists as comma-separated numbers.
func attrValue(v *C.PJRT_NamedValue) string {
	switch C.bd_attr_type(v) {
	case C.PJRT_NamedValue_kString:
		return C.GoStringN(C.bd_attr_string(v), C.int(v.value_size))
	case C.PJRT_NamedValue_kInt64:
		return strconv.FormatInt(int64(C.bd_attr_int64(v)), 10)
	case C.PJRT_NamedValue_kInt64List:
		n := int(v.value_size)
		if n == 0 {
			return ""
		}
		vals := unsafe.Slice((*int64)(unsafe.Pointer(C.bd_attr_int64s(v))), n)
		parts := make([]string, n)
		for i, x := range vals {
			parts[i] = strconv.FormatInt(x, 10)
		}
		return strings.Join(parts, ",")
	case C.PJRT_NamedValue_kFloat:
		return strconv.FormatFloat(float64(C.bd_attr_float(v)), 'g', -1, 32)
	case C.PJRT_NamedValue_kBool:
		return strconv.FormatBool(C.bd_attr_bool(v) != 0)
	}
	return ""
}
