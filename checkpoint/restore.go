package checkpoint

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/explore"
)

// RestoreOptions tell Restore how many clones to make and what to do
// with them.
type RestoreOptions struct {
	Clones int
	// Keep leaves every clone's branch when the clones end; else the
	// first clone to exit 0 commits and the others are killed and
	// aborted, as speculate's candidates are.
	Keep bool
	// Lazy restores with CRIU's lazy pages: the tree runs before its
	// memory is all in, and our page server sends the rest as it faults
	// or in the background. The first lazy restore of an image records
	// the pages the clones fault in (its working set); later ones copy
	// that set in before the tree runs (prefetch).
	Lazy bool
	// Restored, when set, is called once every clone is restored, before
	// any has been waited for.
	Restored func([]*Clone)
	// From restores an image kept elsewhere instead of the branch's
	// latest (see Source).
	From *Source
}

// Clone is one restored copy of a checkpoint.
type Clone struct {
	Index     int     `json:"index"`
	Branch    string  `json:"branch"`
	ID        string  `json:"id"`         // its generation id (CloneDir/id)
	PID       int     `json:"pid"`        // the tree's root, in the clone's PID namespace
	RestoreMS float64 `json:"restore_ms"` // from start to restored
	StartedMS float64 `json:"started_ms"` // from start to its run started (branch, namespaces, cgroup)
	CRIUMS    float64 `json:"criu_ms"`    // how long criu restore took in it
	ExitCode  int     `json:"exit_code"`
	Signal    string  `json:"signal,omitempty"`
	Committed bool    `json:"committed"`
	Aborted   bool    `json:"aborted"`
	Error     string  `json:"error,omitempty"`

	proc    *explore.Proc
	created bool // its branch was made
	// logs is where CRIU's restore writes its log and pid file, staged in
	// the store: a kept clone's go into its branch's data (RestoresArea)
	// once it ended.
	logs string
}

// report is a clone's answer to Restore: restored (pid, criuMS), or why not.
type report struct {
	i      int
	pid    int
	criuMS float64
	err    error
}

// startClone makes clone c's branch, a child of parent, with its data in
// store (Mount.Store), and starts its run, whose starter restores the tree
// (cfg, completed here), and sends the starter's report to send.
// Preconditions: c's Index, Branch and ID are set.
func startClone(ctx context.Context, m *explore.Mount, store, parent string, c *Clone, cfg cloneConfig, exe string, maxPID int,
	start time.Time, pages *pageServers, send func(report)) error {
	i := c.Index
	if _, err := m.Create(parent, c.Branch); err != nil {
		return fmt.Errorf("clone %d: %w", i, err)
	}
	c.created = true
	data, err := branch.StageData(store)
	if err != nil {
		return fmt.Errorf("clone %d (%s): %w", i, c.Branch, err)
	}
	c.logs = data
	if pages != nil {
		if cfg.PageSocket, err = pages.listen(data); err != nil {
			return fmt.Errorf("clone %d (%s): the page server: %w", i, c.Branch, err)
		}
	}
	cfg.Log, cfg.PIDFile = filepath.Join(data, "restore.log"), filepath.Join(data, "restore.pid")
	cfg.ID, cfg.Index, cfg.Branch = c.ID, i, c.Branch
	raw, _ := json.Marshal(cfg)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	spec := explore.Spec{Args: []string{exe}, Branch: c.Branch, Dir: "/", Index: i,
		Env:    []string{envClone + "=" + string(raw), "PATH=" + os.Getenv("PATH")},
		Stdout: w, Stderr: w, LastPID: maxPID + 64,
		// As the checkpointed run was: CRIU dumps a run on the FUSE path,
		// whose branch can be frozen under it (see Checkpoint).
		DataPath: explore.DataPathFUSE}
	p, err := m.Start(ctx, spec)
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("clone %d (%s): %w", i, c.Branch, err)
	}
	c.proc, c.StartedMS = p, ms(time.Since(start))
	go func() {
		defer r.Close()
		line, _ := bufio.NewReader(r).ReadString('\n')
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, reportOK+" "); ok {
			rep := report{i: i}
			fmt.Sscanf(rest, "%d %g", &rep.pid, &rep.criuMS)
			send(rep)
			return
		}
		if why, ok := strings.CutPrefix(line, "error: "); ok {
			send(report{i: i, err: errors.New(why)})
			return
		}
		res := p.Wait()
		why := res.Error
		if why == "" {
			why = fmt.Sprintf("its starter ended (exit %d %s) before the restore", res.ExitCode, res.Signal)
			if line != "" {
				why += fmt.Sprintf(", having said %q", line)
			}
		}
		send(report{i: i, err: errors.New(why)})
	}()
	return nil
}

// Outcome is how a restore went.
type Outcome struct {
	Branch    string  `json:"branch"`
	Image     int     `json:"image"`
	Winner    string  `json:"winner,omitempty"`
	RestoreMS float64 `json:"restore_ms"` // until every clone was restored
	Lazy      bool    `json:"lazy,omitempty"`
	// WorkingSet is the working set a lazy restore prefetched (a file in
	// the image), Prefetched how many pages that made eager; Recording
	// says the clones record the working set instead.
	WorkingSet string `json:"working_set,omitempty"`
	Prefetched int64  `json:"prefetched_pages,omitempty"`
	Recording  bool   `json:"recording,omitempty"`
	// Fetched is, for a lazy restore from a Source with Pages, what was
	// read from it before the clones ran (the pages CRIU reads itself:
	// the working set and those that are never lazy), and Requests the
	// requests that took, where the Source counts them.
	Fetched  *Fill    `json:"fetched,omitempty"`
	Requests int64    `json:"fetch_requests,omitempty"`
	Clones   []*Clone `json:"clones"`
}

// Restore restores the latest checkpoint of branch name as o.Clones
// clones, all or none, then waits for them and ends their branches.
func Restore(ctx context.Context, m *explore.Mount, name string, o RestoreOptions) (*Outcome, error) {
	criu, err := Available()
	if err != nil {
		return nil, err
	}
	if o.Clones < 1 {
		return nil, fmt.Errorf("--clones must be at least 1")
	}
	if err := branch.ValidateName(name); err != nil {
		return nil, err
	}
	store, err := m.Store()
	if err != nil {
		return nil, err
	}
	var meta ImageMeta
	var dir string
	if o.From != nil {
		meta, dir = o.From.Meta, o.From.Dir
	} else if meta, dir, err = LatestImage(store, name); err != nil {
		return nil, err
	}
	if hi, err := m.Info(meta.Hold); err != nil || hi.State != branch.Live.String() {
		return nil, fmt.Errorf("the files of checkpoint %d of %s are gone (branch %s changed since; checkpoint again)", meta.Gen, name, name)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	out := &Outcome{Branch: name, Image: meta.Gen, Lazy: o.Lazy}
	start := time.Now()
	images := dir
	var pages *pageServers
	if o.Lazy {
		ws, err := readWorkingSet(dir)
		if err == nil && o.From != nil && len(o.From.WorkingSet) > 0 {
			ws, err = parseWorkingSet(o.From.WorkingSet)
		}
		if err != nil {
			return nil, err
		}
		if o.From != nil && o.From.Pages != nil {
			// What CRIU reads itself comes first; the rest is served.
			var req0 int64
			if o.From.Requests != nil {
				req0 = o.From.Requests()
			}
			fill, err := o.From.fillPages(ctx, ws)
			if err != nil {
				return nil, fmt.Errorf("fetching the pages restored first: %w", err)
			}
			out.Fetched = &fill
			if o.From.Requests != nil {
				out.Requests = o.From.Requests() - req0
			}
			pages = &pageServers{src: o.From, record: len(ws) == 0}
			defer pages.close()
		}
		if len(ws) == 0 {
			out.Recording = true
		} else {
			staged, err := branch.StageData(store)
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(staged)
			if out.Prefetched, err = prefetchImages(dir, staged, ws); err != nil {
				return nil, fmt.Errorf("prefetching the working set of checkpoint %d: %w", meta.Gen, err)
			}
			images, out.WorkingSet = staged, filepath.Join(dir, WorkingSetName)
			if o.From != nil && len(o.From.WorkingSet) > 0 {
				out.WorkingSet = o.From.WorkingSetFrom
			}
		}
	}
	reports := make(chan report, o.Clones)
	for i := range o.Clones {
		out.Clones = append(out.Clones, &Clone{Index: i, Branch: fmt.Sprintf("%s-clone-%s-%d", name, randomHex(4), i), ID: randomHex(16)})
	}
	// Every clone's branch and run are set up at once: one after another
	// they kept the last clone's restore waiting for all the others' set-
	// ups (1.3 of 4.3 s for 10 clones under TCG). Each clone sends one
	// report: its set-up's error or its starter's.
	var setups sync.WaitGroup
	for _, c := range out.Clones {
		setups.Add(1)
		go func() {
			defer setups.Done()
			if err := startClone(ctx, m, store, name, c, cloneConfig{CRIU: criu, Images: images, Lazy: o.Lazy, Pages: dir,
				Record: out.Recording && pages == nil}, exe, meta.MaxPID, start, pages, func(r report) { reports <- r }); err != nil {
				reports <- report{i: c.Index, err: err}
			}
		}()
	}
	undo := func(cause error) (*Outcome, error) {
		setups.Wait()
		for _, c := range out.Clones {
			if c.proc != nil {
				c.proc.Kill()
			}
		}
		for _, c := range out.Clones {
			switch {
			case c.proc != nil:
				c.proc.Abort()
			case c.created:
				m.Abort(c.Branch, true)
			default:
				continue
			}
			c.Aborted = true
		}
		for _, c := range out.Clones {
			if c.logs != "" {
				os.RemoveAll(c.logs)
			}
		}
		return out, cause
	}
	var firstErr error
	for range o.Clones {
		rep := <-reports
		c := out.Clones[rep.i]
		if rep.err != nil {
			c.Error = rep.err.Error()
			if firstErr == nil {
				firstErr = fmt.Errorf("clone %d (%s) failed to restore: %w; every clone was ended", rep.i, c.Branch, rep.err)
			}
			continue
		}
		c.PID, c.RestoreMS, c.CRIUMS = rep.pid, ms(time.Since(start)), rep.criuMS
	}
	setups.Wait()
	if firstErr != nil {
		return undo(firstErr)
	}
	out.RestoreMS = ms(time.Since(start))
	if o.Restored != nil {
		o.Restored(out.Clones)
	}
	// The race: as each clone ends, the first to succeed commits.
	done := make(chan *Clone, o.Clones)
	for _, c := range out.Clones {
		go func(c *Clone) {
			res := c.proc.Wait()
			c.ExitCode, c.Signal = res.ExitCode, res.Signal
			if res.Error != "" {
				c.Error = res.Error
			}
			done <- c
		}(c)
	}
	for range o.Clones {
		c := <-done
		if !o.Keep {
			os.RemoveAll(c.logs) // they would go with the branch
		}
		switch {
		case o.Keep:
			c.proc.Keep()
			if _, err := m.Publish(c.Branch, RestoresArea, c.logs); err != nil {
				os.RemoveAll(c.logs)
			}
		case out.Winner == "" && c.ExitCode == 0 && c.Error == "":
			if err := c.proc.Commit(); err != nil {
				c.Error = err.Error()
				c.proc.Abort()
				c.Aborted = true
				continue
			}
			c.Committed, out.Winner = true, c.Branch
			for _, other := range out.Clones {
				if other != c {
					other.proc.Kill()
				}
			}
			// The commit changed the checkpoint's files: its hold,
			// now stale, goes.
			m.Abort(meta.Hold, true)
		default:
			c.proc.Abort()
			c.Aborted = true
		}
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
