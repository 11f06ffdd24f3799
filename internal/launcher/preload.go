package launcher

import (
	"slices"
	"sync/atomic"

	"github.com/gotrain/gotrain/internal/launcher/pystandby"
	"github.com/gotrain/gotrain/internal/torchhook"
)

// learnedImports is what the job's first attempt imported: the installed
// packages the torch hook listed in a rank's timings file (once its
// init_process_group returned, or 30 s in). Python standbys import them
// while they wait (pystandby.Link.Preload), so that a restarted rank finds
// transformers, datasets, ... imported as it finds torch. Only the loop's
// goroutine uses it.
type learnedImports struct {
	modules []string // nil until learned
	told    map[int]bool
	// said: the line saying what the standbys preload was printed (by
	// the first standby's answer, on its Read goroutine).
	said atomic.Bool
}

// preloaded is a standby's answer to Preload: the first one is said.
func (a *agent) preloaded(modules []string, tried int) {
	if !a.learned.said.Swap(true) {
		a.stderr.WriteLine("", []byte(pystandby.PreloadLine(modules, tried)))
	}
}

// learnImports, each tick: learns the list from the first rank that wrote
// one, then hands it to every Python standby not told yet.
func (a *agent) learnImports() {
	dir := a.torchDir()
	if a.py == nil || dir == "" {
		return
	}
	l := &a.learned
	if l.modules == nil {
		for _, p := range a.reg.procs {
			if p.who.Standby || p.pid() <= 0 {
				continue
			}
			fs, err := torchhook.ReadFacts(torchhook.PhasesPath(dir, p.pid()))
			if err != nil || fs.Modules == nil {
				continue
			}
			// torch is every standby's already.
			l.modules = slices.DeleteFunc(slices.Clone(fs.Modules), func(m string) bool { return m == "torch" })
			l.told = map[int]bool{}
			break
		}
	}
	if len(l.modules) == 0 {
		return
	}
	for _, p := range a.reg.procs {
		if p.py == nil || !p.who.Standby || l.told[p.pid()] {
			continue
		}
		l.told[p.pid()] = true
		if err := p.py.Preload(l.modules, pystandby.PreloadSeconds, pystandby.PreloadGrowth); err != nil {
			a.log.Warn("cannot tell the Python standby what to preload", "slot", p.who.Slot, "pid", p.pid(), "err", err)
		}
	}
}
