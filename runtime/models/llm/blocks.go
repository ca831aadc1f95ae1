package llm

import (
	"cmp"
	"slices"
	"sync"
)

// blockPool is the KV cache's accounting: which of the cache's fixed-size
// blocks each sequence holds, and how many of its positions are written.
// Blocks are handed out lowest index first so runs are reproducible.
type blockPool struct {
	size int // tokens per block

	mu     sync.Mutex
	free   []int32 // a stack: the top is the lowest free index
	total  int
	seqs   map[uint64]*seqBlocks
	maxPer int // blocks one sequence may hold (the context length's)
}

type seqBlocks struct {
	blocks []int32
	filled int // positions written by successful steps
}

func newBlockPool(blocks, size, maxPer int) *blockPool {
	p := &blockPool{size: size, total: blocks, seqs: map[uint64]*seqBlocks{}, maxPer: maxPer}
	p.free = make([]int32, blocks)
	for i := range p.free {
		p.free[i] = int32(blocks - 1 - i)
	}
	return p
}

// reserve makes seq hold blocks for tokens positions in all; false (and no
// change) when the free blocks do not suffice or tokens exceed what one
// sequence may hold.
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
	if need-have > len(p.free) {
		return false
	}
	if s == nil {
		s = &seqBlocks{}
		p.seqs[seq] = s
	}
	for range need - have {
		s.blocks = append(s.blocks, p.free[len(p.free)-1])
		p.free = p.free[:len(p.free)-1]
	}
	return true
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
	p.free = append(p.free, s.blocks...)
	// Keep the stack sorted (descending) so allocation order does not
	// depend on release order.
	sortDesc(p.free)
}

func sortDesc(a []int32) { slices.SortFunc(a, func(x, y int32) int { return cmp.Compare(y, x) }) }

// used returns the blocks held and the pool's size.
func (p *blockPool) used() (used, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total - len(p.free), p.total
}

// snapshot returns a copy of seq's blocks and its written length; ok is
// false when seq holds none.
func (p *blockPool) snapshot(seq uint64) (blocks []int32, filled int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seqs[seq]
	if s == nil {
		return nil, 0, false
	}
	return append([]int32(nil), s.blocks...), s.filled, true
}

// setFilled records that seq's positions below n are written.
func (p *blockPool) setFilled(seq uint64, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.seqs[seq]; s != nil {
		s.filled = n
	}
}
