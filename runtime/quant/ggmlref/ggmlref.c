#include "ggmlref.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// struct ggml_type_traits as ggml/include/ggml.h declares it in the
// llama.cpp builds node-llama-cpp 3.21.x bundles (since the CPU backend
// split, mid 2024). Open checks it against the library: the names and sizes
// against ggml_type_name, ggml_blck_size and ggml_type_size, and to_float
// against known values.
typedef void (*ggml_to_float_t)(const void *x, float *y, int64_t k);
typedef void (*ggml_from_float_t)(const float *x, void *y, int64_t k);
struct ggml_type_traits {
	const char *type_name;
	int64_t blck_size;
	int64_t blck_size_interleave;
	size_t type_size;
	bool is_quantized;
	ggml_to_float_t to_float;
	ggml_from_float_t from_float_ref;
};

struct ggmlref_lib {
	void *h;
	const struct ggml_type_traits *(*get_type_traits)(int type);
	size_t (*quantize_chunk)(int type, const float *src, void *dst, int64_t start, int64_t nrows,
	                         int64_t n_per_row, const float *imatrix);
	bool (*requires_imatrix)(int type);
	int64_t (*blck_size)(int type);
	size_t (*type_size)(int type);
	const char *(*type_name)(int type);
	const char *(*commit)(void);
	const char *(*version)(void);
};

#define SYM(field, name)                                                     \
	do {                                                                     \
		*(void **)(&l->field) = dlsym(l->h, name);                           \
		if (!l->field) {                                                     \
			snprintf(err, errlen, "%s: no symbol %s", path, name);           \
			dlclose(l->h);                                                   \
			free(l);                                                         \
			return NULL;                                                     \
		}                                                                    \
	} while (0)

ggmlref_lib *ggmlref_open(const char *path, char *err, size_t errlen) {
	ggmlref_lib *l = calloc(1, sizeof *l);
	if (!l) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!l->h) {
		snprintf(err, errlen, "%s", dlerror());
		free(l);
		return NULL;
	}
	SYM(get_type_traits, "ggml_get_type_traits");
	SYM(quantize_chunk, "ggml_quantize_chunk");
	SYM(requires_imatrix, "ggml_quantize_requires_imatrix");
	SYM(blck_size, "ggml_blck_size");
	SYM(type_size, "ggml_type_size");
	SYM(type_name, "ggml_type_name");
	// ggml_commit and ggml_version are newer than the rest: optional.
	*(void **)(&l->commit) = dlsym(l->h, "ggml_commit");
	*(void **)(&l->version) = dlsym(l->h, "ggml_version");
	return l;
}

const char *ggmlref_commit(ggmlref_lib *l) { return l->commit ? l->commit() : ""; }
const char *ggmlref_version(ggmlref_lib *l) { return l->version ? l->version() : ""; }

void ggmlref_traits_of(ggmlref_lib *l, int type, ggmlref_traits *out) {
	const struct ggml_type_traits *t = l->get_type_traits(type);
	memset(out, 0, sizeof *out);
	out->name = t->type_name;
	out->blck_size = t->blck_size;
	out->blck_size_interleave = t->blck_size_interleave;
	out->type_size = t->type_size;
	out->is_quantized = t->is_quantized;
	out->has_to_float = t->to_float != NULL;
	out->fn_blck_size = l->blck_size(type);
	out->fn_type_size = l->type_size(type);
	out->fn_type_name = l->type_name(type);
}

int ggmlref_requires_imatrix(ggmlref_lib *l, int type) { return l->requires_imatrix(type); }

size_t ggmlref_quantize(ggmlref_lib *l, int type, const float *src, void *dst, int64_t nrows, int64_t n_per_row) {
	return l->quantize_chunk(type, src, dst, 0, nrows, n_per_row, NULL);
}

int ggmlref_to_float(ggmlref_lib *l, int type, const void *src, float *dst, int64_t k) {
	const struct ggml_type_traits *t = l->get_type_traits(type);
	if (!t->to_float) {
		return 0;
	}
	t->to_float(src, dst, k);
	return 1;
}
