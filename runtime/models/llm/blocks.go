package llm

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sync"
)

// blockPool is the KV cache's accounting: which of the cache's fixed-size
// blocks each sequence holds and how many of its positions are written.
//
// With prefix caching, a block whose positions are all written is
// registered under the hash of the sequence's tokens up to its end (a
// chain over the blocks before it), and a sequence whose next tokens fill
// a block with the same history maps that block instead of computing it:
// sequences sharing a prompt prefix (the council's system prompt) share
// its blocks and skip its prefill. A full block is never written again, so
// sharing needs no copy. Released blocks that are registered stay cached,
// evicted least recently released first when free blocks run out.
type blockPool struct {
	size   int // tokens per block
	maxPer int // blocks one sequence may hold (the context length's)
	prefix bool

	mu       sync.Mutex
	total    int
	free     []int32 // a stack, sorted descending: the top is the lowest index
	refs     []int32 // sequences holding each block
	seqs     map[uint64]*seqBlocks
	seed     maphash.Seed
	cached   map[uint64]int32 // chain hash → registered block
	blockKey []cacheKey       // each block's registration (hash 0: none)
	idle     []int32          // registered blocks no sequence holds, oldest first
	// step is the blocks the step being planned writes whole, by chain
	// hash (startStep): a sequence later in the step with the same history
	// maps them as it maps cached ones. A step writes every row's K and V
	// before any row attends, so its rows read them written.
	step map[uint64]stepBlock
}

// stepBlock is a block a step writes whole, and its tokens.
type stepBlock struct {
	b      int32
	tokens []int32
}

type cacheKey struct {
	hash   uint64
	tokens []int32 // the block's tokens, compared on a hash match
}

type seqBlocks struct {
	blocks  []int32
	filled  int      // positions written by successful steps
	chain   []uint64 // chain hash of each full block
	pending []int32  // tokens of the written part of the block being filled
}

func newBlockPool(blocks, size, maxPer int, prefix bool) *blockPool {
	p := &blockPool{
		size: size, total: blocks, maxPer: maxPer, prefix: prefix,
		refs: make([]int32, blocks), seqs: map[uint64]*seqBlocks{}, seed: maphash.MakeSeed(),
		cached: map[uint64]int32{}, blockKey: make([]cacheKey, blocks), step: map[uint64]stepBlock{},
	}
	p.free = make([]int32, blocks)
	for i := range p.free {
		p.free[i] = int32(blocks - 1 - i)
	}
	return p
}

// take returns a free block, evicting the oldest idle cached one when
// none is free; the caller checked that one exists.
func (p *blockPool) take() int32 {
	if n := len(p.free); n > 0 {
		b := p.free[n-1]
		p.free = p.free[:n-1]
		p.refs[b] = 1
		return b
	}
	b := p.idle[0]
	p.idle = p.idle[1:]
	p.unregister(b)
	p.refs[b] = 1
	return b
}

func (p *blockPool) unregister(b int32) {
	if k := p.blockKey[b]; k.tokens != nil {
		if p.cached[k.hash] == b {
			delete(p.cached, k.hash)
		}
		p.blockKey[b] = cacheKey{}
	}
}

// drop releases one hold of block b.
func (p *blockPool) drop(b int32) {
	p.refs[b]--
	if p.refs[b] > 0 {
		return
	}
	if p.blockKey[b].tokens != nil {
		p.idle = append(p.idle, b)
		return
	}
	p.free = append(p.free, b)
	sortDesc(p.free)
}

func sortDesc(a []int32) { slices.SortFunc(a, func(x, y int32) int { return cmp.Compare(y, x) }) }

// reserve makes seq hold blocks for tokens positions in all; false (and no
// change) when the available blocks do not suffice or tokens exceed what
// one sequence may hold.
func (p *blockPool) reserve(seq uint64, tokens int) bool {
	need := (tokens + p.size - 1) / p.size
	if tokens < 0 || need > p.maxPer {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	have := 0
	if s != nil {
		have = len(s.blocks)
	}
	if need <= have {
		return true
	}
	if need-have > len(p.free)+len(p.idle) {
		return false
	}
	if s == nil {
		s = &seqBlocks{}
		p.seqs[seq] = s
	}
	for range need - have {
		s.blocks = append(s.blocks, p.take())
	}
	return true
}

// room is the positions seq's blocks hold.
func (p *blockPool) room(seq uint64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.seqs[seq]; s != nil {
		return len(s.blocks) * p.size
	}
	return 0
}

// release returns seq's blocks to the pool.
func (p *blockPool) release(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	if s == nil {
		return
	}
	delete(p.seqs, seq)
	for _, b := range s.blocks {
		p.drop(b)
	}
}

// trim gives back the blocks seq holds past its written positions and the
// next one: the room a step's refused guesses took. They are past what
// the sequence wrote, so no other sequence maps them and none is cached.
func (p *blockPool) trim(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	if s == nil {
		return
	}
	keep := s.filled/p.size + 1
	for len(s.blocks) > keep {
		n := len(s.blocks) - 1
		p.drop(s.blocks[n])
		s.blocks = s.blocks[:n]
	}
}

// used returns the blocks held by sequences and the pool's size; idle
// cached blocks count as free.
func (p *blockPool) used() (used, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total - len(p.free) - len(p.idle), p.total
}

// chainHash is the hash of a block's tokens after the blocks whose chain
// hash is prev.
func (p *blockPool) chainHash(prev uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(p.seed)
	var b [8]byte
	for i := range 8 {
		b[i] = byte(prev >> (8 * i))
	}
	h.Write(b[:])
	for _, t := range tokens {
		h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1 // 0 means "not registered"
}

// startStep forgets the blocks of the step planned before (its sequences'
// commits registered those it wrote).
func (p *blockPool) startStep() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.step)
}

// begin prepares seq's part of a step running tokens from position pos:
// with prefix caching, the leading full blocks of tokens whose history is
// cached, or written whole by a sequence earlier in the step, are mapped
// into seq's table and skipped, and the full blocks seq writes are offered
// to the sequences after it. It returns seq's block table and how many of
// tokens are skipped: all of them only when last is false, else never the
// last one, which runs and samples. ok is false when seq holds no blocks.
func (p *blockPool) begin(seq uint64, pos int, tokens []int32, last bool) (blocks []int32, filled, skip int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	if s == nil {
		return nil, 0, 0, false
	}
	if !p.prefix || pos != s.filled || pos%p.size != 0 {
		return slices.Clone(s.blocks), s.filled, 0, true
	}
	for skip+p.size < len(tokens) || !last && skip+p.size == len(tokens) {
		k := (pos + skip) / p.size
		if k >= len(s.blocks) || len(s.chain) != k {
			break
		}
		blk := tokens[skip : skip+p.size]
		h := p.chainHash(p.chainAt(s, k), blk)
		b, hit := p.cached[h]
		if !hit || !slices.Equal(p.blockKey[b].tokens, blk) {
			sb, written := p.step[h]
			if !written || !slices.Equal(sb.tokens, blk) {
				break
			}
			b = sb.b
		}
		if p.refs[b] == 0 {
			p.idle = slices.DeleteFunc(p.idle, func(x int32) bool { return x == b })
		}
		p.refs[b]++
		p.drop(s.blocks[k])
		s.blocks[k] = b
		s.chain = append(s.chain, h)
		s.filled += p.size
		skip += p.size
	}
	// What this step writes whole, from the first block not mapped (whose
	// history the chain holds whole).
	if len(s.chain) != (pos+skip)/p.size {
		return slices.Clone(s.blocks), s.filled, skip, true
	}
	prev := p.chainAt(s, len(s.chain))
	for off := skip; off+p.size <= len(tokens); off += p.size {
		k := (pos + off) / p.size
		if k >= len(s.blocks) {
			break
		}
		blk := tokens[off : off+p.size]
		h := p.chainHash(prev, blk)
		if _, dup := p.step[h]; !dup {
			p.step[h] = stepBlock{b: s.blocks[k], tokens: blk}
		}
		prev = h
	}
	return slices.Clone(s.blocks), s.filled, skip, true
}

// chainAt is the chain hash of seq's blocks before block k (0 for none).
func (p *blockPool) chainAt(s *seqBlocks, k int) uint64 {
	if k == 0 {
		return 0
	}
	return s.chain[k-1]
}

// commit records that a step wrote tokens at positions from pos of seq,
// and registers the blocks it filled.
func (p *blockPool) commit(seq uint64, pos int, tokens []int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	if s == nil || pos != s.filled {
		return // released meanwhile
	}
	s.filled += len(tokens)
	if !p.prefix {
		return
	}
	for _, t := range tokens {
		s.pending = append(s.pending, t)
		if len(s.pending) < p.size {
			continue
		}
		k := len(s.chain)
		var prev uint64
		if k > 0 {
			prev = s.chain[k-1]
		}
		h := p.chainHash(prev, s.pending)
		s.chain = append(s.chain, h)
		b := s.blocks[k]
		if _, dup := p.cached[h]; !dup && p.blockKey[b].tokens == nil {
			p.cached[h] = b
			p.blockKey[b] = cacheKey{hash: h, tokens: slices.Clone(s.pending)}
		}
		s.pending = s.pending[:0]
	}
}
