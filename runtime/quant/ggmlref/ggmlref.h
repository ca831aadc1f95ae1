// The C side of ggmlref: llama.cpp's libggml-base.so opened with dlopen at
// run time, so that nothing links it at build time.
#ifndef BROKERD_GGMLREF_H
#define BROKERD_GGMLREF_H

#include <stddef.h>
#include <stdint.h>

typedef struct ggmlref_lib ggmlref_lib;

// ggmlref_traits is the part of ggml's struct ggml_type_traits the tests
// use, copied out of the library's table.
typedef struct {
	const char *name;
	int64_t blck_size;
	int64_t blck_size_interleave;
	size_t type_size;
	int is_quantized;
	int has_to_float;
	// what the library's own ggml_blck_size and ggml_type_size say: the same
	// numbers through code compiled against the real layout.
	int64_t fn_blck_size;
	size_t fn_type_size;
	const char *fn_type_name;
} ggmlref_traits;

// ggmlref_open loads the library at path; on failure it returns NULL and
// writes why into err.
ggmlref_lib *ggmlref_open(const char *path, char *err, size_t errlen);
const char *ggmlref_commit(ggmlref_lib *l);
const char *ggmlref_version(ggmlref_lib *l);
void ggmlref_traits_of(ggmlref_lib *l, int type, ggmlref_traits *out);
int ggmlref_requires_imatrix(ggmlref_lib *l, int type);
size_t ggmlref_quantize(ggmlref_lib *l, int type, const float *src, void *dst, int64_t nrows, int64_t n_per_row);
// ggmlref_to_float runs the type's to_float over k elements; 0 when the type
// has none.
int ggmlref_to_float(ggmlref_lib *l, int type, const void *src, float *dst, int64_t k);

#endif
