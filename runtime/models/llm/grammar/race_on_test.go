//go:build race

package grammar

// raceEnabled: the race detector slows the full-vocabulary tests tenfold;
// they check fewer steps under it.
const raceEnabled = true
