package hashenc

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
)

// paraphrases are pairs with the same meaning in different wording. Any two
// sentences from different pairs are about unrelated things.
var paraphrases = [][2]string{
	{"the cat sat on the mat", "a cat was sitting on the mat"},
	{"The meeting has been moved to Thursday afternoon.", "We rescheduled the meeting for Thursday afternoon."},
	{"How do I reset my password?", "What are the steps to reset a forgotten password?"},
	{"The server crashed because it ran out of memory.", "Out-of-memory errors caused the server to crash."},
	{"She bought fresh vegetables at the farmers market.", "At the farmers' market she purchased some fresh vegetables."},
	{"The train to Berlin was delayed by two hours.", "Our Berlin train arrived two hours late."},
	{"Please send me the quarterly sales report.", "Could you email me the sales report for this quarter?"},
	{"The children played football in the park after school.", "After school, the kids were playing football in the park."},
	{"Drinking enough water is important for your health.", "It is important for health to drink enough water."},
	{"The new smartphone has a larger battery and a better camera.", "The latest smartphone comes with a bigger battery and an improved camera."},
	{"Heavy rain caused flooding in several towns.", "Several towns were flooded after the heavy rain."},
	{"The company announced record profits this year.", "This year the company reported record profits."},
	{"He is learning to play the piano.", "He's taking piano lessons and learning to play."},
	{"The restaurant closes at ten o'clock on weekdays.", "On weekdays the restaurant closes at 10 o'clock."},
	{"Scientists discovered a new species of frog in the rainforest.", "A new frog species was discovered by scientists in the rainforest."},
	{"Turn off the lights when you leave the room.", "Please switch the lights off when leaving the room."},
}

func cosine(a, b []float32) float64 {
	var dot, na, nb float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	if na == 0 || nb == 0 {
		return 0
	}
	return dot / math.Sqrt(na*nb)
}

type scoredPair struct {
	a, b string
	cos  float64
}

// TestQualityParaphrasesBeatUnrelated checks that every paraphrase pair has
// a higher cosine than every unrelated pair (any two sentences from
// different paraphrase pairs), through the full pipeline on a device.
func TestQualityParaphrasesBeatUnrelated(t *testing.T) {
	m := New()
	r := newTestReplica(t, m, newFakeDevice(0, orderBlocked))
	type sent struct {
		text string
		pair int
	}
	var sents []sent
	for i, p := range paraphrases {
		sents = append(sents, sent{p[0], i}, sent{p[1], i})
	}
	vecs := encodeAll(t, r, func() []string {
		var s []string
		for _, x := range sents {
			s = append(s, x.text)
		}
		return s
	}(), true)

	var para, unrel []scoredPair
	for i := range sents {
		for j := i + 1; j < len(sents); j++ {
			p := scoredPair{sents[i].text, sents[j].text, cosine(vecs[i], vecs[j])}
			if sents[i].pair == sents[j].pair {
				para = append(para, p)
			} else {
				unrel = append(unrel, p)
			}
		}
	}
	if len(para) < 12 {
		t.Fatalf("only %d paraphrase pairs", len(para))
	}
	sort.Slice(para, func(i, j int) bool { return para[i].cos < para[j].cos })
	sort.Slice(unrel, func(i, j int) bool { return unrel[i].cos > unrel[j].cos })
	var violations []string
	for _, p := range para {
		for _, u := range unrel {
			if u.cos < p.cos {
				break // sorted: no later unrelated pair beats p
			}
			violations = append(violations, fmt.Sprintf("paraphrase %.3f (%q / %q) <= unrelated %.3f (%q / %q)",
				p.cos, p.a, p.b, u.cos, u.a, u.b))
		}
	}
	t.Logf("paraphrase cosines: min %.3f, max %.3f; unrelated: max %.3f (%d paraphrase, %d unrelated pairs)",
		para[0].cos, para[len(para)-1].cos, unrel[0].cos, len(para), len(unrel))
	if len(violations) > 0 {
		t.Errorf("%d violations:\n%s", len(violations), strings.Join(violations, "\n"))
	}
}
