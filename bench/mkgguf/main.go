// Command mkgguf writes a checkpoint that bench/mkllm wrote as a GGUF file
// of one of modelkit.FileTypes into a model repository (REPO/NAME/VERSION/
// NAME.gguf: a version directory holding one GGUF file is a generator
// model), the quantized types by llama.cpp's own quantizer
// (ggml_quantize_chunk of libggml-base.so, through runtime/quant/ggmlref),
// so the file holds what llama-quantize would write. With -dequantized it
// also writes the file's weights decoded to float32 as a Hugging Face
// checkpoint (modelkit.WriteDequantized): what brokerd holds on a device
// that cannot keep the blocks, for a reference to run.
//
//	mkgguf -from REPO/qwen2-rand/1 -type q4_k_m -repo REPO -name qwen2-q4km \
//	    -ggml-lib lib/libggml-base.so -dequantized DIR
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/brokerd/brokerd/bench/modelkit"
	"github.com/brokerd/brokerd/runtime/quant/ggmlref"
)

func main() {
	from := flag.String("from", "", "the checkpoint directory mkllm wrote (required)")
	ftype := flag.String("type", "q4_k_m", "GGUF file type: "+strings.Join(modelkit.FileTypes, ", "))
	repo := flag.String("repo", "", "model repository directory (required)")
	name := flag.String("name", "", "model name (required)")
	version := flag.Int("version", 1, "model version")
	lib := flag.String("ggml-lib", "", "llama.cpp's libggml-base.so, for the quantized types (default: $BROKERD_GGML_LIB, else runtime/quant/ggmlref's npm copy)")
	deq := flag.String("dequantized", "", "also write the file's weights, dequantized to float32, as a Hugging Face checkpoint in this directory")
	flag.Parse()
	if *from == "" || *repo == "" || *name == "" {
		fmt.Fprintln(os.Stderr, "mkgguf: -from, -repo and -name are required")
		os.Exit(2)
	}
	if !slices.Contains(modelkit.FileTypes, *ftype) {
		fmt.Fprintf(os.Stderr, "mkgguf: -type %q: want one of %v\n", *ftype, modelkit.FileTypes)
		os.Exit(2)
	}
	if err := run(*from, *ftype, filepath.Join(*repo, *name, strconv.Itoa(*version)), *name, *lib, *deq); err != nil {
		fmt.Fprintln(os.Stderr, "mkgguf:", err)
		os.Exit(1)
	}
}

func run(from, ftype, dir, name, libPath, deq string) error {
	var q modelkit.Quantizer
	switch ftype {
	case "f32", "f16", "bf16", "q8_0":
		// modelkit writes these itself (its Q8_0 is ggml's bytes, tested).
	default:
		if libPath == "" {
			libPath = os.Getenv("BROKERD_GGML_LIB")
		}
		if libPath == "" {
			libPath = ggmlref.DefaultPath()
		}
		lib, err := ggmlref.Open(libPath)
		if err != nil {
			return err
		}
		fmt.Printf("quantizer: ggml_quantize_chunk of %s (ggml %s %s)\n", lib.Path, lib.Version, lib.Commit)
		q = lib.Quantize
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, name+".gguf")
	t0 := time.Now()
	n, err := modelkit.WriteGGUFQuantized(from, path, ftype, q)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s: %s, %.1f MiB in %.1f s\n", path, ftype, float64(n)/(1<<20), time.Since(t0).Seconds())
	if deq == "" {
		return nil
	}
	t0 = time.Now()
	types, err := modelkit.WriteDequantized(path, from, deq)
	if err != nil {
		return err
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(types)) {
		parts = append(parts, fmt.Sprintf("%d %s", types[k], k))
	}
	fmt.Printf("wrote %s: the file's tensors (%s) dequantized by runtime/quant to float32 in %.1f s\n", deq, strings.Join(parts, ", "), time.Since(t0).Seconds())
	return nil
}
