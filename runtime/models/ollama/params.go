package ollama

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
)

// Params is a model's params layer (the PARAMETER lines of its Modelfile):
// the options Ollama applies when a request sets none. A nil field is not
// set. Values are typed as Ollama types them (api.Options) and checked
// for their type only: ranges are the caller's (its sampling validation).
type Params struct {
	// Sampling.
	Stop             []string
	Temperature      *float32
	TopK             *int
	TopP             *float32
	MinP             *float32
	TypicalP         *float32
	RepeatPenalty    *float32
	RepeatLastN      *int
	PresencePenalty  *float32
	FrequencyPenalty *float32
	Seed             *int64
	NumPredict       *int // most tokens generated (-1: unbounded, -2: until the context is full)
	NumKeep          *int
	// Runner.
	NumCtx          *int // context length
	NumBatch        *int
	NumGPU          *int
	MainGPU         *int
	NumThread       *int
	UseMMap         *bool
	DraftNumPredict *int
	// Ignored are the keys Ollama no longer reads (mirostat, tfs_z,
	// penalize_newline, ...) or never did, sorted: Ollama warns and goes
	// on, and so may the caller.
	Ignored []string
}

// maxStops bounds the stop strings of a params layer.
const maxStops = 256

// parseParams reads a params layer: one JSON object whose known keys have
// Ollama's types (an integer option must be an integer, a float a finite
// float32, stop an array of strings; null is unset).
func parseParams(b []byte) (Params, error) {
	var raw map[string]json.RawMessage
	if err := strictJSON(b, &raw); err != nil {
		return Params{}, err
	}
	if raw == nil {
		return Params{}, fmt.Errorf("not a JSON object")
	}
	var p Params
	ints := map[string]**int{
		"top_k": &p.TopK, "repeat_last_n": &p.RepeatLastN, "num_predict": &p.NumPredict, "num_keep": &p.NumKeep,
		"num_ctx": &p.NumCtx, "num_batch": &p.NumBatch, "num_gpu": &p.NumGPU, "main_gpu": &p.MainGPU,
		"num_thread": &p.NumThread, "draft_num_predict": &p.DraftNumPredict,
	}
	floats := map[string]**float32{
		"temperature": &p.Temperature, "top_p": &p.TopP, "min_p": &p.MinP, "typical_p": &p.TypicalP,
		"repeat_penalty": &p.RepeatPenalty, "presence_penalty": &p.PresencePenalty, "frequency_penalty": &p.FrequencyPenalty,
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		v := bytes.TrimSpace(raw[k])
		if string(v) == "null" {
			continue
		}
		if dst, ok := ints[k]; ok {
			i, err := jsonInt(v, math.MinInt32, math.MaxInt32)
			if err != nil {
				return Params{}, fmt.Errorf("%s: %w", k, err)
			}
			n := int(i)
			*dst = &n
			continue
		}
		if dst, ok := floats[k]; ok {
			f, err := jsonFloat32(v)
			if err != nil {
				return Params{}, fmt.Errorf("%s: %w", k, err)
			}
			*dst = &f
			continue
		}
		switch k {
		case "seed":
			i, err := jsonInt(v, math.MinInt64, math.MaxInt64)
			if err != nil {
				return Params{}, fmt.Errorf("%s: %w", k, err)
			}
			p.Seed = &i
		case "use_mmap":
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return Params{}, fmt.Errorf("%s: %s: want true or false", k, v)
			}
			p.UseMMap = &b
		case "stop":
			var st []string
			if err := json.Unmarshal(v, &st); err != nil {
				return Params{}, fmt.Errorf("stop: want an array of strings")
			}
			if len(st) > maxStops {
				return Params{}, fmt.Errorf("stop: %d strings, at most %d", len(st), maxStops)
			}
			p.Stop = st
		default:
			p.Ignored = append(p.Ignored, k)
		}
	}
	return p, nil
}

// jsonInt reads a JSON number that is an integer in [lo, hi] (4096.0 and
// 4.096e3 are; 40.5 is not: Ollama never writes one, its
// Modelfile parser reads integer options with strconv.ParseInt).
func jsonInt(v []byte, lo, hi int64) (int64, error) {
	var num json.Number
	if len(v) == 0 || v[0] == '"' || json.Unmarshal(v, &num) != nil {
		return 0, fmt.Errorf("%s: want an integer", clip(v))
	}
	if i, err := strconv.ParseInt(string(num), 10, 64); err == nil {
		if i < lo || i > hi {
			return 0, fmt.Errorf("%d: want %d to %d", i, lo, hi)
		}
		return i, nil
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) || f >= 1<<63 {
		return 0, fmt.Errorf("%s: want an integer from %d to %d", clip(v), lo, hi)
	}
	return int64(f), nil
}

// jsonFloat32 reads a JSON number that is a finite float32.
func jsonFloat32(v []byte) (float32, error) {
	var f float64
	if err := json.Unmarshal(v, &f); err != nil {
		return 0, fmt.Errorf("%s: want a number", clip(v))
	}
	f32 := float32(f)
	if math.IsInf(float64(f32), 0) || math.IsNaN(float64(f32)) {
		return 0, fmt.Errorf("%s: out of float32's range", clip(v))
	}
	return f32, nil
}

// clip shortens a value for a message.
func clip(v []byte) string {
	const max = 40
	if len(v) > max {
		return strconv.Quote(string(v[:max])) + "..."
	}
	return string(v)
}
