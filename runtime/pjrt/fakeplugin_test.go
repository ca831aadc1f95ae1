package pjrt

import (
	"os"
	"path/filepath"
	"testing"
)

// fullFakePlugin is a PJRT plugin built with the real pjrt_c_api.h: it
// implements plugin set-up, client creation and device listing, and fails
// every compile and transfer with an error of its own, so the adapter's
// paths up to the first device call run without hardware. Macros choose how
// it breaks:
//
//	NULL_TABLE      every function pointer NULL
//	SHORT_TABLE     struct_size ends before PJRT_Client_Create
//	INIT_FAIL       PJRT_Plugin_Initialize returns an error
//	CREATE_FAIL     PJRT_Client_Create returns an error
//	NDEV=n          number of devices (default 2)
//	NO_PCI          devices expose no pci_bus_id attribute
//	MINOR=n         API minor version (default 67)
const fullFakePlugin = `
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pjrt_c_api.h"

#ifndef NDEV
#define NDEV 2
#endif
#ifndef MINOR
#define MINOR 67
#endif

struct PJRT_Error { PJRT_Error_Code code; char msg[200]; };
struct PJRT_Client { int unused; };
struct PJRT_Device { int i; };
struct PJRT_DeviceDescription { int i; };

static PJRT_Error* fail(PJRT_Error_Code code, const char* msg) {
	PJRT_Error* e = calloc(1, sizeof *e);
	e->code = code;
	snprintf(e->msg, sizeof e->msg, "%s", msg);
	return e;
}
static void error_destroy(PJRT_Error_Destroy_Args* a) { free(a->error); }
static void error_message(PJRT_Error_Message_Args* a) { a->message = a->error->msg; a->message_size = strlen(a->error->msg); }
static PJRT_Error* error_getcode(PJRT_Error_GetCode_Args* a) { a->code = a->error->code; return NULL; }

static PJRT_Error* plugin_initialize(PJRT_Plugin_Initialize_Args* a) {
#ifdef INIT_FAIL
	return fail(PJRT_Error_Code_INTERNAL, "fake: initialise failed");
#else
	return NULL;
#endif
}
static PJRT_Error* plugin_attributes(PJRT_Plugin_Attributes_Args* a) { a->attributes = NULL; a->num_attributes = 0; return NULL; }

static struct PJRT_Client the_client;
static struct PJRT_Device devs[NDEV > 0 ? NDEV : 1];
static PJRT_Device* dev_ptrs[NDEV > 0 ? NDEV : 1];
static struct PJRT_DeviceDescription descs[NDEV > 0 ? NDEV : 1];
static char pci[NDEV > 0 ? NDEV : 1][16];
static int64_t coords[3] = {1, 2, 3};
static PJRT_NamedValue attrs[NDEV > 0 ? NDEV : 1][3];

static PJRT_Error* client_create(PJRT_Client_Create_Args* a) {
#ifdef CREATE_FAIL
	return fail(PJRT_Error_Code_FAILED_PRECONDITION, "fake: no CUDA device found");
#else
	for (int i = 0; i < NDEV; i++) {
		devs[i].i = i;
		dev_ptrs[i] = &devs[i];
		descs[i].i = i;
		snprintf(pci[i], sizeof pci[i], "0000:%02x:00.0", 0x10 + i);
		PJRT_NamedValue* v = attrs[i];
		v[0].struct_size = PJRT_NamedValue_STRUCT_SIZE; v[0].name = "core_count"; v[0].name_size = 10;
		v[0].type = PJRT_NamedValue_kInt64; v[0].int64_value = 132; v[0].value_size = 1;
		v[1].struct_size = PJRT_NamedValue_STRUCT_SIZE; v[1].name = "coords"; v[1].name_size = 6;
		v[1].type = PJRT_NamedValue_kInt64List; v[1].int64_array_value = coords; v[1].value_size = 3;
		v[2].struct_size = PJRT_NamedValue_STRUCT_SIZE; v[2].name = "pci_bus_id"; v[2].name_size = 10;
		v[2].type = PJRT_NamedValue_kString; v[2].string_value = pci[i]; v[2].value_size = strlen(pci[i]);
	}
	a->client = &the_client;
	return NULL;
#endif
}
static PJRT_Error* client_destroy(PJRT_Client_Destroy_Args* a) { return NULL; }
static PJRT_Error* client_platform_name(PJRT_Client_PlatformName_Args* a) { a->platform_name = "fake"; a->platform_name_size = 4; return NULL; }
static PJRT_Error* client_platform_version(PJRT_Client_PlatformVersion_Args* a) { a->platform_version = "fake 1.0"; a->platform_version_size = 8; return NULL; }
static PJRT_Error* client_process_index(PJRT_Client_ProcessIndex_Args* a) { a->process_index = 0; return NULL; }
static PJRT_Error* client_addressable_devices(PJRT_Client_AddressableDevices_Args* a) {
	a->addressable_devices = dev_ptrs;
	a->num_addressable_devices = NDEV;
	return NULL;
}
static PJRT_Error* client_compile(PJRT_Client_Compile_Args* a) { return fail(PJRT_Error_Code_UNIMPLEMENTED, "fake: cannot compile"); }
static PJRT_Error* client_buffer_from_host(PJRT_Client_BufferFromHostBuffer_Args* a) { return fail(PJRT_Error_Code_RESOURCE_EXHAUSTED, "fake: no device memory"); }

static PJRT_Error* device_get_description(PJRT_Device_GetDescription_Args* a) { a->device_description = &descs[a->device->i]; return NULL; }
static PJRT_Error* device_local_hardware_id(PJRT_Device_LocalHardwareId_Args* a) { a->local_hardware_id = a->device->i; return NULL; }
static PJRT_Error* device_is_addressable(PJRT_Device_IsAddressable_Args* a) { a->is_addressable = true; return NULL; }
static PJRT_Error* desc_id(PJRT_DeviceDescription_Id_Args* a) { a->id = 100 + a->device_description->i; return NULL; }
static PJRT_Error* desc_process_index(PJRT_DeviceDescription_ProcessIndex_Args* a) { a->process_index = 0; return NULL; }
static PJRT_Error* desc_kind(PJRT_DeviceDescription_Kind_Args* a) { a->device_kind = "Fake GPU"; a->device_kind_size = 8; return NULL; }
static PJRT_Error* desc_debug_string(PJRT_DeviceDescription_DebugString_Args* a) { a->debug_string = "fake"; a->debug_string_size = 4; return NULL; }
static PJRT_Error* desc_attributes(PJRT_DeviceDescription_Attributes_Args* a) {
	a->attributes = attrs[a->device_description->i];
#ifdef NO_PCI
	a->num_attributes = 2;
#else
	a->num_attributes = 3;
#endif
	return NULL;
}

// Functions brokerd requires but the fake never reaches; the cast is only
// ever called through the PJRT_Error*(Args*) shape every one has.
static PJRT_Error* unimplemented(void* args) { return fail(PJRT_Error_Code_UNIMPLEMENTED, "fake: unimplemented"); }

static PJRT_Api api;

const PJRT_Api* GetPjrtApi(void) {
	memset(&api, 0, sizeof api);
	api.struct_size = PJRT_Api_STRUCT_SIZE;
	api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
	api.pjrt_api_version.major_version = 0;
	api.pjrt_api_version.minor_version = MINOR;
#ifdef SHORT_TABLE
	api.struct_size = offsetof(PJRT_Api, PJRT_Client_Create);
#endif
#ifndef NULL_TABLE
	api.PJRT_Error_Destroy = error_destroy;
	api.PJRT_Error_Message = error_message;
	api.PJRT_Error_GetCode = error_getcode;
	api.PJRT_Plugin_Initialize = plugin_initialize;
	api.PJRT_Plugin_Attributes = plugin_attributes;
	api.PJRT_Event_Destroy = (void*)unimplemented;
	api.PJRT_Event_Await = (void*)unimplemented;
	api.PJRT_Client_Create = client_create;
	api.PJRT_Client_Destroy = client_destroy;
	api.PJRT_Client_PlatformName = client_platform_name;
	api.PJRT_Client_PlatformVersion = client_platform_version;
	api.PJRT_Client_ProcessIndex = client_process_index;
	api.PJRT_Client_AddressableDevices = client_addressable_devices;
	api.PJRT_Client_Compile = client_compile;
	api.PJRT_Client_BufferFromHostBuffer = client_buffer_from_host;
	api.PJRT_DeviceDescription_Id = desc_id;
	api.PJRT_DeviceDescription_ProcessIndex = desc_process_index;
	api.PJRT_DeviceDescription_Attributes = desc_attributes;
	api.PJRT_DeviceDescription_Kind = desc_kind;
	api.PJRT_DeviceDescription_DebugString = desc_debug_string;
	api.PJRT_Device_GetDescription = device_get_description;
	api.PJRT_Device_LocalHardwareId = device_local_hardware_id;
	api.PJRT_Device_IsAddressable = device_is_addressable;
	api.PJRT_Executable_GetCompiledMemoryStats = (void*)unimplemented;
	api.PJRT_LoadedExecutable_Destroy = (void*)unimplemented;
	api.PJRT_LoadedExecutable_GetExecutable = (void*)unimplemented;
	api.PJRT_LoadedExecutable_Execute = (void*)unimplemented;
	api.PJRT_Executable_Destroy = (void*)unimplemented;
	api.PJRT_Executable_Name = (void*)unimplemented;
	api.PJRT_Executable_NumOutputs = (void*)unimplemented;
	api.PJRT_Buffer_Destroy = (void*)unimplemented;
	api.PJRT_Buffer_ToHostBuffer = (void*)unimplemented;
	api.PJRT_Buffer_Dimensions = (void*)unimplemented;
	api.PJRT_Buffer_ElementType = (void*)unimplemented;
#endif
	return &api;
}
`

// buildFakePlugin compiles fullFakePlugin against this package's copy of
// pjrt_c_api.h into dir/name.
func buildFakePlugin(t *testing.T, dir, name string, defines ...string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return buildLib(t, dir, name, fullFakePlugin, append(defines, "-I"+filepath.Clean(wd))...)
}
