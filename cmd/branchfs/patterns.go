package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/branchfs/branchfs/explore"
	"github.com/spf13/cobra"
)

// The exploration patterns as subcommands, each a thin layer over
// explore. Candidates are shell command lines (-c, repeatable) or
// N copies of one command after "--" (-n), told apart by BRANCHFS_INDEX.

// candidatesHelp ends the description of the patterns that take
// candidates.
const candidatesHelp = `

A candidate is a shell command line (-c, repeatable) or one of N copies of the command after "--"
(-n N), told apart by $BRANCHFS_INDEX. Each runs as by branchfs run: in a branch of its own (a child of
--parent, default main) in which MNT shows that branch, with every process it starts ending with it.
--max-parallel N runs at most N at once, the others waiting their turn; those that start together
start their commands together, once each is set up. --candidate-timeout ends a candidate that runs
longer. A candidate's output lines are printed with its index in front ("[2] ..."); --output-dir DIR
writes them to DIR/INDEX.out and DIR/INDEX.err instead, and --json holds the last 64 KiB of each.
The outcome is printed (--json: as JSON).`

type patternFlags struct {
	n           int
	cmds        []string
	parent      string
	timeout     time.Duration
	candTimeout time.Duration
	maxParallel int
	maxStorage  sizeValue
	outputDir   string
	asJSON      bool
	binds       []string
	limits      limitFlags
	lim         explore.Limits

	files   []*os.File      // --output-dir's, closed by report
	prefix  []*prefixWriter // the terminal's, flushed by report
	mu      sync.Mutex
	pattern string
	// dataPath is each candidate's, as run --data-path.
	dataPath string
}

func (f *patternFlags) add(c *cobra.Command, withN bool) {
	if withN {
		c.Flags().IntVarP(&f.n, "n", "n", 0, "run N copies of the command after --")
		c.Flags().StringArrayVarP(&f.cmds, "command", "c", nil, "a candidate, as a shell command line (repeatable)")
	}
	c.Flags().StringVar(&f.parent, "parent", "", "branch the candidates branch from (default main)")
	c.Flags().DurationVar(&f.timeout, "timeout", 0, "end the pattern after this long (per level for tree and beam)")
	c.Flags().DurationVar(&f.candTimeout, "candidate-timeout", 0, "end each candidate that runs longer than this (from when its command starts)")
	c.Flags().Var(&f.maxStorage, "max-storage", "limit what each candidate's branch holds of its own changes to SIZE bytes (512K, 10G): its writes beyond it fail with EDQUOT")
	c.Flags().IntVar(&f.maxParallel, "max-parallel", 0, "run at most N candidates at once; the others wait their turn (0: all at once)")
	c.Flags().StringVar(&f.outputDir, "output-dir", "", "write each candidate's output to DIR/INDEX.out and DIR/INDEX.err instead of the terminal")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print the outcome as JSON on stdout (candidates' stdout goes to stderr)")
	c.Flags().StringArrayVar(&f.binds, "bind", nil, "also show each candidate's branch at this path (repeatable)")
	f.limits.add(c, "each candidate")
	c.Flags().StringVar(&f.dataPath, "data-path", string(explore.DataPathAuto), "as run --data-path: kernel, fuse or auto")
	c.Args = cobra.ArbitraryArgs
}

// mount parses MNT and the command after "--" (when one is wanted).
func (f *patternFlags) mount(name string, cmd *cobra.Command, args []string, wantCmd bool) (*explore.Mount, []string, error) {
	dash := cmd.ArgsLenAtDash()
	var rest []string
	if dash >= 0 {
		rest = args[dash:]
		args = args[:dash]
	}
	if len(args) != 1 {
		return nil, nil, fmt.Errorf("%s: usage: branchfs %s", name, cmd.Use)
	}
	if wantCmd && len(rest) == 0 {
		return nil, nil, fmt.Errorf("%s: no command after --", name)
	}
	if !wantCmd && len(rest) > 0 {
		return nil, nil, fmt.Errorf("%s: unexpected command after --", name)
	}
	f.pattern = name
	if f.timeout < 0 {
		return nil, nil, fmt.Errorf("%s: --timeout must not be negative", name)
	}
	if f.candTimeout < 0 {
		return nil, nil, fmt.Errorf("%s: --candidate-timeout must not be negative", name)
	}
	if f.maxParallel < 0 {
		return nil, nil, fmt.Errorf("%s: --max-parallel must not be negative", name)
	}
	f.lim = f.limits.limits()
	if f.outputDir != "" {
		if fi, err := os.Stat(f.outputDir); err != nil || !fi.IsDir() {
			return nil, nil, fmt.Errorf("%s: --output-dir %s: not a directory", name, f.outputDir)
		}
	}
	dp, err := explore.ParseDataPath(f.dataPath)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: --%w", name, err)
	}
	m, err := openMount(args[0])
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	m.SetDataPath(dp)
	return m, rest, nil
}

// candidates is -c's command lines, or n copies of the command after --.
func (f *patternFlags) candidates(name string, cmd *cobra.Command, args []string) (*explore.Mount, [][]string, error) {
	if (f.n > 0) == (len(f.cmds) > 0) {
		return nil, nil, fmt.Errorf("%s: give -n N with a command after --, or -c CMD (repeatable)", name)
	}
	m, rest, err := f.mount(name, cmd, args, f.n > 0)
	if err != nil {
		return nil, nil, err
	}
	if f.n > 1024 {
		return nil, nil, fmt.Errorf("%s: -n %d: at most 1024", name, f.n)
	}
	var cands [][]string
	for range f.n {
		cands = append(cands, rest)
	}
	for _, c := range f.cmds {
		cands = append(cands, explore.Shell(c))
	}
	return m, cands, nil
}

func (f *patternFlags) options() explore.Options {
	o := explore.Options{Parent: f.parent, Timeout: f.timeout, CandidateTimeout: f.candTimeout, MaxParallel: f.maxParallel, Limits: f.lim,
		MaxStorage: int64(f.maxStorage),
		Binds:      f.binds, Stderr: os.Stderr, KeepOutput: f.asJSON, Warn: warn(f.pattern)}
	o.Dir, _ = os.Getwd()
	stdout := io.Writer(os.Stdout)
	if f.asJSON {
		stdout = os.Stderr // the outcome is the only thing on stdout
	}
	o.Output = func(i int) (io.Writer, io.Writer) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.outputDir != "" {
			var w [2]io.Writer
			for k, ext := range []string{".out", ".err"} {
				file, err := os.OpenFile(filepath.Join(f.outputDir, strconv.Itoa(i)+ext), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
				if err != nil {
					fmt.Fprintf(os.Stderr, "branchfs: %s: candidate %d: %v\n", f.pattern, i, err)
					continue
				}
				f.files = append(f.files, file)
				w[k] = file
			}
			return w[0], w[1]
		}
		out := &prefixWriter{prefix: fmt.Sprintf("[%d] ", i), w: stdout, mu: &f.mu}
		errw := &prefixWriter{prefix: fmt.Sprintf("[%d] ", i), w: os.Stderr, mu: &f.mu}
		f.prefix = append(f.prefix, out, errw)
		return out, errw
	}
	return o
}

// prefixWriter writes whole lines, each with its prefix, so that the
// lines of candidates running at once stay whole and tell whose they are.
type prefixWriter struct {
	prefix string
	w      io.Writer
	mu     *sync.Mutex // shared by every prefixWriter of a pattern
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	i := bytes.LastIndexByte(p.buf, '\n')
	if i < 0 && len(p.buf) < 64<<10 {
		return len(b), nil
	}
	if i < 0 {
		i = len(p.buf) - 1
	}
	p.emit(p.buf[:i+1])
	p.buf = append(p.buf[:0], p.buf[i+1:]...)
	return len(b), nil
}

func (p *prefixWriter) emit(data []byte) {
	var out []byte
	for line := range bytes.Lines(data) {
		out = append(append(out, p.prefix...), line...)
		if out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
	}
	p.w.Write(out)
}

// flush writes what is left of a last line without a newline.
func (p *prefixWriter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) > 0 {
		p.emit(p.buf)
		p.buf = nil
	}
}

// report prints the outcome and turns it into the exit status: 0 when a
// candidate committed (or, with best-of-n --no-commit, won), else 1.
func (f *patternFlags) report(out *explore.Outcome, err error, sig int) error {
	f.mu.Lock()
	files, prefix := f.files, f.prefix
	f.mu.Unlock()
	for _, p := range prefix {
		p.flush()
	}
	for _, file := range files {
		file.Close()
	}
	if out != nil {
		warnContainment(f.pattern, out.Results)
		if f.asJSON {
			json.NewEncoder(os.Stdout).Encode(out)
		} else {
			if w := out.WinnerResult(); w != nil {
				verb := "committed"
				if !out.Committed {
					verb = "best, not committed"
				}
				fmt.Printf("winner: %d (%s, %s)\n", *out.Winner, w.Branch, verb)
			} else {
				fmt.Println("no winner")
			}
			for i, r := range out.Results {
				if r.NotStarted {
					fmt.Printf("  [%d] not started\n", i)
					continue
				}
				state := "fail"
				if r.Success() {
					state = "ok"
				}
				line := fmt.Sprintf("  [%d] %-4s exit %d", i, state, r.ExitCode)
				if r.Signal != "" {
					line += " (" + r.Signal + ")"
				}
				if r.TimedOut {
					line += " timed out"
				}
				if r.StorageRefused > 0 {
					line += fmt.Sprintf(" (storage limit: %d writes refused)", r.StorageRefused)
				}
				if hit := limitsHit(r); hit != "" {
					line += " " + hit
				}
				if r.Score != nil {
					line += " score " + strconv.FormatFloat(*r.Score, 'g', -1, 64)
				}
				if r.Error != "" {
					line += ": " + r.Error
				}
				fmt.Println(line)
			}
		}
	}
	if sig != 0 {
		return exitStatus(sig)
	}
	if err != nil {
		return err
	}
	if out.Winner == nil {
		return exitStatus(1)
	}
	return nil
}

func speculateCmd() *cobra.Command {
	var f patternFlags
	c := &cobra.Command{
		Use:   "speculate (-n N MNT -- CMD ARGS... | -c CMD... MNT)",
		Short: "Run candidates in parallel branches; the first to succeed commits, the others are killed and aborted",
		Long: `Run every candidate at once, each in a branch of its own. The first to exit 0 is committed; the others
are killed and their branches aborted.` + candidatesHelp,
		Example: `  branchfs speculate -c 'make test' -c 'make CC=clang test' /mnt/p
  branchfs speculate -n 4 /mnt/p -- ./fix.sh`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, cands, err := f.candidates("speculate", cmd, args)
			if err != nil {
				return err
			}
			ctx, stop := interruptible()
			out, err := m.Speculate(ctx, cands, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, true)
	return c
}

func bestOfNCmd() *cobra.Command {
	var f patternFlags
	var noCommit bool
	c := &cobra.Command{
		Use:   "best-of-n (-n N MNT -- CMD ARGS... | -c CMD... MNT)",
		Short: "Run candidates to the end; each may write a score to fd 3; the best success commits",
		Long: `Run every candidate to the end. A candidate may write its score (a number, higher is better) to file
descriptor 3; the successful candidate with the highest score (the first of equals) is committed (--no-commit: only reported),
the other branches are aborted.` + candidatesHelp,
		Example: `  branchfs best-of-n -n 3 /mnt/p -- sh -c './attempt.sh && ./score.sh >&3'
  branchfs best-of-n --no-commit -c ./a.sh -c ./b.sh /mnt/p`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, cands, err := f.candidates("best-of-n", cmd, args)
			if err != nil {
				return err
			}
			ctx, stop := interruptible()
			out, err := m.BestOfN(ctx, cands, !noCommit, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, true)
	c.Flags().BoolVar(&noCommit, "no-commit", false, "abort every branch; only report the scores")
	return c
}

func reflexionCmd() *cobra.Command {
	var f patternFlags
	var retries int
	var critique string
	c := &cobra.Command{
		Use:   "reflexion MNT -- CMD ARGS...",
		Short: "Retry CMD in a fresh branch until it succeeds, feeding each attempt the last one's output (BRANCHFS_FEEDBACK)",
		Long: `Run CMD in a fresh branch; when it fails, abort the branch and run it again, up to --retries times,
with $BRANCHFS_FEEDBACK holding the failed attempt's output (or what --critique printed in its branch).
The first attempt that exits 0 is committed.`,
		Example: `  branchfs reflexion --retries 5 /mnt/p -- ./agent.sh
  branchfs reflexion --critique 'make test 2>&1 | tail -20' /mnt/p -- ./agent.sh`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, rest, err := f.mount("reflexion", cmd, args, true)
			if err != nil {
				return err
			}
			var crit []string
			if cmd.Flags().Changed("critique") {
				crit = explore.Shell(critique)
				if strings.TrimSpace(critique) == "" {
					return errors.New("reflexion: empty --critique")
				}
			}
			ctx, stop := interruptible()
			out, err := m.Reflexion(ctx, rest, retries, crit, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, false)
	c.Flags().IntVar(&retries, "retries", 3, "attempts at most")
	c.Flags().StringVar(&critique, "critique", "", "shell command run in a failed attempt's branch; its output is the next attempt's feedback")
	return c
}

func cascadedCmd() *cobra.Command {
	var f patternFlags
	var fanOut []int
	var waveTimeout time.Duration
	c := &cobra.Command{
		Use:   "cascaded MNT -- CMD ARGS...",
		Short: "Run waves of CMD, wider each time, each fed the failures so far; the first success commits",
		Long: `Run CMD in waves of branches, each wave as wide as the next --fan-out number, with
$BRANCHFS_FEEDBACK holding the output of the failures so far. The first candidate to exit 0 is
committed and the others of its wave are killed and aborted.`,
		Example: `  branchfs cascaded --fan-out 1,2,4 --wave-timeout 5m /mnt/p -- ./agent.sh`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, rest, err := f.mount("cascaded", cmd, args, true)
			if err != nil {
				return err
			}
			ctx, stop := interruptible()
			out, err := m.Cascaded(ctx, rest, fanOut, waveTimeout, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, false)
	c.Flags().IntSliceVar(&fanOut, "fan-out", []int{1, 2, 4}, "candidates in each wave")
	c.Flags().DurationVar(&waveTimeout, "wave-timeout", 0, "end each wave after this long")
	return c
}

func tournamentCmd() *cobra.Command {
	var f patternFlags
	var judge string
	c := &cobra.Command{
		Use:   "tournament --judge CMD (-n N MNT -- CMD ARGS... | -c CMD... MNT)",
		Short: "Run candidates to the end, then narrow the successes by pairs; JUDGE A B prints 0 or 1; the last one commits",
		Long: `Run every candidate to the end, then pit the successful ones against each other by pairs: --judge
gets the two branches' views as $1 and $2 and prints 0 when the first wins, 1 when the second does.
The last one standing is committed.` + candidatesHelp,
		Example: `  branchfs tournament --judge './compare.sh "$1" "$2"' -n 4 /mnt/p -- ./agent.sh`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(judge) == "" {
				return errors.New("tournament: --judge is required")
			}
			m, cands, err := f.candidates("tournament", cmd, args)
			if err != nil {
				return err
			}
			// The views are the judge's $1 and $2.
			j := []string{"sh", "-c", judge, "judge"}
			ctx, stop := interruptible()
			out, err := m.Tournament(ctx, cands, j, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, true)
	c.Flags().StringVar(&judge, "judge", "", "shell command; gets the two branches' views as $1 and $2, prints 0 (first wins) or 1")
	return c
}

func treeCmd() *cobra.Command {
	var f patternFlags
	var expand string
	var depth int
	c := &cobra.Command{
		Use:   "tree (-n N MNT -- CMD ARGS... | -c CMD... MNT)",
		Short: "Best of the strategies at each level; EXPAND prints the next level's strategies from the winner's state",
		Long: `Run the candidates (the strategies) as best-of-n does. With --expand and a --depth above 1, the levels
happen in a branch of their own: each level's best is committed into it, then --expand runs there
($BRANCHFS_DEPTH is the next level) and prints the next level's strategies, one shell command line a
line. That branch is committed once every level has had a winner, and aborted when one has none.` + candidatesHelp,
		Example: `  branchfs tree -c ./plan-a.sh -c ./plan-b.sh --expand ./next-steps.sh --depth 3 /mnt/p`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, cands, err := f.candidates("tree", cmd, args)
			if err != nil {
				return err
			}
			var exp []string
			if expand != "" {
				exp = explore.Shell(expand)
			}
			ctx, stop := interruptible()
			out, err := m.Tree(ctx, cands, exp, depth, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, true)
	c.Flags().StringVar(&expand, "expand", "", "shell command run in the tree's branch after each level; prints the next level's strategies, one a line")
	c.Flags().IntVar(&depth, "depth", 1, "levels")
	return c
}

func beamCmd() *cobra.Command {
	var f patternFlags
	var expand string
	var width, depth int
	c := &cobra.Command{
		Use:   "beam (-n N MNT -- CMD ARGS... | -c CMD... MNT) --expand CMD",
		Short: "Keep the K best branches at each level; EXPAND prints each survivor's children; the best leaf commits",
		Long: `Run the candidates and keep the --width best successes (by the score each writes to file descriptor
3). At each next level --expand runs in every survivor's branch and prints its children's strategies,
one a line, which run as child branches; the --width best of them all survive. After --depth levels
the best survivor is committed, and its ancestors up to --parent; everything else is aborted.` + candidatesHelp,
		Example: `  branchfs beam -n 4 --expand ./children.sh --width 2 --depth 3 /mnt/p -- ./step.sh`,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, cands, err := f.candidates("beam", cmd, args)
			if err != nil {
				return err
			}
			var exp []string
			if expand != "" {
				exp = explore.Shell(expand)
			}
			ctx, stop := interruptible()
			out, err := m.Beam(ctx, cands, exp, width, depth, f.options())
			return f.report(out, err, stop())
		},
	}
	f.add(c, true)
	c.Flags().StringVar(&expand, "expand", "", "shell command run in each surviving branch; prints its children's strategies, one a line")
	c.Flags().IntVar(&width, "width", 3, "branches kept at each level")
	c.Flags().IntVar(&depth, "depth", 2, "levels")
	return c
}
