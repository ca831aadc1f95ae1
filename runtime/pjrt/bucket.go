package pjrt

// XLA compiles one program per input shape, and a compile takes from tens of
// milliseconds to seconds, so batches and sequences are padded to a few
// bucket sizes. Padding needs to know what a dimension means (a padded
// sequence position must be masked out, a padded row must be zeros), which
// only the model knows, so the models pad: a device says which sizes it
// wants through PadBuckets, and these pure functions do the arithmetic.

// MaxBatchBucket is the largest batch bucket PadBuckets lists: the largest
// batch plan (TPU factor 128 × a base batch of 32).
const MaxBatchBucket = 4096

// SeqBuckets returns the sequence buckets: 32, 64, 128, 256, 512.
func SeqBuckets() []int { return []int{32, 64, 128, 256, 512} }

// BatchBuckets returns the batch buckets up to maxBatch: the powers of two
// below it, then maxBatch itself (a power of two or not), so a full batch is
// never padded past the plan.
func BatchBuckets(maxBatch int) []int {
	var out []int
	for b := 1; b < maxBatch; b *= 2 {
		out = append(out, b)
	}
	if maxBatch >= 1 {
		out = append(out, maxBatch)
	}
	return out
}

// Bucket returns the smallest of buckets (ascending) that holds n, or n
// itself when none does (a sequence longer than the last bucket compiles a
// program of its own length) or n < 1.
func Bucket(n int, buckets []int) int {
	if n < 1 {
		return n
	}
	for _, b := range buckets {
		if b >= n {
			return b
		}
	}
	return n
}

// PadRows returns src, rows of cols values, with zero rows appended up to
// rows; src itself when it already has them. Zero rows change no other
// row's result in any op of runtime/adapter.go.
func PadRows[T float32 | int32](src []T, cols, rows int) []T {
	if cols <= 0 || len(src) >= rows*cols {
		return src
	}
	out := make([]T, rows*cols)
	copy(out, src)
	return out
}

// SliceRows returns the first rows rows of src (rows of cols values), the
// results of the real items of a padded batch.
func SliceRows[T float32 | int32](src []T, cols, rows int) []T {
	n := min(rows*cols, len(src))
	return src[:n:n]
}

// PadSeq widens rows of seq values to padded values each, zero-filling the
// tail: a [B,S] tensor (token ids, masks) becomes [B,padded]. src itself
// when padded <= seq.
func PadSeq[T float32 | int32](src []T, rows, seq, padded int) []T {
	if padded <= seq || seq <= 0 {
		return src
	}
	out := make([]T, rows*padded)
	for r := 0; r < rows && (r+1)*seq <= len(src); r++ {
		copy(out[r*padded:], src[r*seq:(r+1)*seq])
	}
	return out
}
