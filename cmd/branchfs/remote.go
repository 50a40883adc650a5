package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/branchfs/branchfs/branch"
	"github.com/branchfs/branchfs/checkpoint"
	"github.com/branchfs/branchfs/ctl"
	"github.com/branchfs/branchfs/explore"
	"github.com/branchfs/branchfs/internal/phase"
	"github.com/branchfs/branchfs/remote"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// The object-store commands: push and pull move a branch through an
// S3-compatible bucket (package remote).

const remoteEnv = `
CREDENTIALS AND ENDPOINTS
  As the AWS tools take them: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, or
  AWS_PROFILE naming a profile of ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
  AWS_CONFIG_FILE); AWS_REGION; AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3 (or the profile's endpoint_url)
  for a self-hosted store, which is then addressed path-style (http://host/bucket/key; ` + remote.PathStyleEnv + `=0
  or 1 chooses); AWS_CA_BUNDLE for a CA to trust. TLS certificates are verified.`

func pushCmd() *cobra.Command {
	var jobs int
	var asJSON bool
	c := &cobra.Command{
		Use:   "push BRANCH URL",
		Short: "Store a branch in an S3-compatible bucket, for pull on another mount",
		Long: `Store what branch BRANCH changed (MNT/@NAME or a path in it; or NAME, from inside the mount) at URL,
s3://BUCKET/KEY (s3://BUCKET/DIR/ stores it at DIR/NAME): its files, deletions, directories made again,
modes, owners, times and xattrs, as chunks named by their content, which every branch pushed under the
same directory shares (a push sends only the chunks the bucket lacks), and a manifest, written last. The
manifest also records what the branch's parent showed at each path the branch changed, which pull checks.
A branch with a checkpoint whose files it still holds (see checkpoint) is pushed with the checkpoint's
image, for restore --from. A push that stops (an error, a dropped connection, Ctrl-C) leaves the manifest
at URL as it was; run it again to go on: the chunks already sent are not sent again. The branch is read
through its view while it may change: stop writing to it for a consistent copy (a checkpoint freezes it).` + remoteEnv,
		Example: `  branchfs push /mnt/p/@try1 s3://team-bucket/project/try1
  AWS_ENDPOINT_URL=http://127.0.0.1:8333 branchfs push try1 s3://local/branches/`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			view, name, err := branchArg(args[0], "push")
			if err != nil {
				return err
			}
			ctx, stop := interruptible()
			d, err := openRemote(ctx, args[1], name)
			if err != nil {
				stop()
				return fmt.Errorf("push %s: %w", name, err)
			}
			st, err := d.push(view, name, nil, remote.Options{Jobs: jobs, Progress: terminal()})
			if sig := stop(); sig != 0 {
				fmt.Fprintf(os.Stderr, "branchfs: push %s interrupted; %s is as it was (push again to go on)\n", name, d.loc)
				return exitStatus(sig)
			}
			if err != nil {
				return fmt.Errorf("push %s to %s: %w (%s is as it was)", name, d.loc, err, d.loc)
			}
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(map[string]any{"url": d.loc.String(), "stats": st})
			}
			fmt.Printf("pushed %s to %s: %d paths, %s in %d chunks; sent %d chunks, %s\n", name, d.loc, st.Paths,
				remote.BytesOf(st.Bytes), st.Chunks, st.Stored, remote.BytesOf(st.Sent))
			return nil
		},
	}
	c.Flags().IntVarP(&jobs, "jobs", "j", remote.DefaultJobs, "requests to keep in flight")
	c.Flags().BoolVar(&asJSON, "json", false, "print what was sent as JSON")
	return c
}

// remoteDest is where a push goes: a manifest's place, and its bucket.
type remoteDest struct {
	ctx context.Context
	loc remote.Location
	b   *remote.Bucket
}

// openRemote connects to the bucket of url, where branch name goes.
func openRemote(ctx context.Context, url, name string) (*remoteDest, error) {
	loc, err := remote.ParseURL(url)
	if err != nil {
		return nil, err
	}
	// The name becomes a component of the key: the same rules apply.
	if loc, err = remote.ParseURL(loc.Under(name).String()); err != nil {
		return nil, err
	}
	b, err := remote.Connect(ctx, loc.Bucket)
	if err != nil {
		return nil, err
	}
	return &remoteDest{ctx, loc, b}, nil
}

// push pushes the branch name whose view is view, with its checkpoint
// when it has one whose files it still holds; stream, if not nil,
// uploaded that checkpoint's files as they were dumped.
func (d *remoteDest) push(view, name string, stream *remote.ImageStream, o remote.Options) (_ *remote.Stats, err error) {
	src := remote.Source{Name: name, View: view, Stream: stream}
	defer func() {
		if err != nil && stream != nil {
			stream.Abort() // if Push did not take it
		}
	}()
	data, err := ctl.Command(view, ctl.CmdDelta)
	if err != nil {
		return nil, ctl.Explain("delta", name, err)
	}
	if err := json.Unmarshal(data, &src.Items); err != nil {
		return nil, err
	}
	phase.Mark("delta read: %d items", len(src.Items))
	if src.Parent, src.ParentView, err = parentOf(view, name); err != nil {
		return nil, err
	}
	phase.Mark("parent found")
	if src.Image, err = pushableImage(filepath.Dir(view), name); err != nil {
		return nil, err
	}
	phase.Mark("image found")
	_, st, err := remote.Push(d.ctx, d.b, d.loc, src, o)
	return st, err
}

// pushableImage is the latest checkpoint of branch name on the mount at
// mnt while its hold keeps the files it was made with, or nil.
func pushableImage(mnt, name string) (*remote.Image, error) {
	m, err := explore.Open(mnt)
	if err != nil {
		return nil, err
	}
	store, err := m.Store()
	if err != nil {
		return nil, nil // not ours to read: the branch goes alone
	}
	meta, dir, err := checkpoint.LatestImage(store, name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if hi, err := m.Info(meta.Hold); err != nil || hi.State != branch.Live.String() {
		return nil, nil // the branch changed since: the image is not of its files
	}
	return &remote.Image{Meta: meta, Dir: dir}, nil
}

// restoreSource readies the checkpoint pushed to url for a restore into
// branch name of the mount m (at mnt): pulls the branch if the mount has
// none, makes its hold, and fetches the image into the store's staging
// place. done(ok) removes that place and, unless ok, aborts the branch
// and the hold it made: a restore that fails leaves the mount as it was.
func restoreSource(ctx context.Context, m *explore.Mount, name, mnt, url string, lazy bool, jobs int) (src *checkpoint.Source, done func(ok bool), err error) {
	var undo []func()
	done = func(ok bool) {
		for i := len(undo) - 1; i >= 0; i-- {
			if !ok || i == 0 {
				undo[i]()
			}
		}
	}
	undo = append(undo, func() {}) // the staging place's, always run
	defer func() {
		if err != nil {
			done(false)
			done = func(bool) {}
		}
	}()
	loc, err := remote.ParseURL(url)
	if err != nil {
		return nil, done, err
	}
	b, err := remote.Connect(ctx, loc.Bucket)
	if err != nil {
		return nil, done, err
	}
	man, err := remote.Fetch(ctx, b, loc)
	if err != nil {
		return nil, done, err
	}
	if man.Checkpoint == nil {
		return nil, done, fmt.Errorf("%s holds a branch without a checkpoint", loc)
	}
	o := remote.Options{Jobs: jobs, Progress: terminal()}
	if _, err := m.Info(name); err != nil {
		root, err := mountPoint(mnt)
		if err != nil {
			return nil, done, err
		}
		if _, err := remote.Pull(ctx, b, loc, man, pullTarget(root, branch.MainName, name), o); err != nil {
			return nil, done, fmt.Errorf("pulling the branch: %w", err)
		}
		undo = append(undo, func() { m.Abort(name, true) })
	}
	hold := checkpoint.HoldName(name)
	if hi, err := m.Info(hold); err != nil || hi.State != branch.Live.String() {
		if err == nil {
			m.Abort(hold, true)
		}
		if _, err := m.Create(name, hold); err != nil {
			return nil, done, fmt.Errorf("freezing the files of %s: %w", name, err)
		}
		undo = append(undo, func() { m.Abort(hold, true) })
	}
	store, err := m.Store()
	if err != nil {
		return nil, done, err
	}
	dir, err := branch.StageData(store)
	if err != nil {
		return nil, done, err
	}
	undo[0] = func() { os.RemoveAll(dir) }
	if _, err := remote.FetchImage(ctx, b, loc, man, dir, lazy, o); err != nil {
		return nil, done, fmt.Errorf("fetching the checkpoint: %w", err)
	}
	meta := man.Checkpoint.Image
	meta.Branch, meta.Hold = name, hold
	src = &checkpoint.Source{Meta: meta, Dir: dir, Jobs: o.Jobs}
	if lazy {
		if src.WorkingSet, err = remote.WorkingSet(ctx, b, loc, man); err != nil {
			return nil, done, err
		}
		src.WorkingSetFrom = remote.WorkingSetURL(loc, man)
		cache := remote.NewBlockCache(remote.DefaultBlockCache)
		src.Pages = func(name string) (checkpoint.PagesFile, error) {
			return remote.OpenImageFile(ctx, b, loc, man, name, cache)
		}
		src.Fill = func(name string) (checkpoint.PagesFile, error) {
			return remote.OpenImageFile(ctx, b, loc, man, name, nil)
		}
		src.SaveWorkingSet = func(data []byte) error { return remote.SaveWorkingSet(ctx, b, loc, man, data) }
		src.Requests = func() int64 { _, _, n := b.Moved(); return n }
	}
	return src, done, nil
}

func pullCmd() *cobra.Command {
	var as, parent string
	var jobs int
	var force, asJSON bool
	c := &cobra.Command{
		Use:   "pull URL MNT",
		Short: "Make a branch pushed to an S3-compatible bucket on the mount at MNT",
		Long: `Make the branch pushed to URL (s3://BUCKET/KEY) a branch of the mount at MNT: named as it was pushed,
or --as NAME, a child of main or of --parent P. The mount's base should be a copy of the one the branch
was pushed from: where P shows another version of a path the branch changed than the pushed branch's
parent showed, pull refuses, naming the paths, and changes nothing (--force pulls anyway: the branch's
versions then replace P's). The branch is made through the mount like any other (created, then written
through its view), so committing it works as for any branch. A pull that fails or is interrupted aborts
the branch it made.` + remoteEnv,
		Example: `  branchfs pull s3://team-bucket/project/try1 /mnt/p
  branchfs pull s3://team-bucket/project/try1 /mnt/p --as try1-review && branchfs commit /mnt/p/@try1-review`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			loc, err := remote.ParseURL(args[0])
			if err != nil {
				return fmt.Errorf("pull: %w", err)
			}
			mnt, err := mountPoint(args[1])
			if err != nil {
				return fmt.Errorf("pull: %w", err)
			}
			if parent != branch.MainName {
				if err := branch.ValidateName(parent); err != nil {
					return fmt.Errorf("pull: --parent: %w", err)
				}
			}
			if as != "" {
				if err := branch.ValidateName(as); err != nil {
					return fmt.Errorf("pull: --as: %w", err)
				}
			}
			ctx, stop := interruptible()
			b, err := remote.Connect(ctx, loc.Bucket)
			if err != nil {
				stop()
				return fmt.Errorf("pull %s: %w", loc, err)
			}
			m, err := remote.Fetch(ctx, b, loc)
			if err != nil {
				stop()
				return fmt.Errorf("pull: %w", err)
			}
			name := as
			if name == "" {
				name = m.Branch
			}
			st, err := remote.Pull(ctx, b, loc, m, pullTarget(mnt, parent, name), remote.Options{Jobs: jobs, Force: force, Progress: terminal()})
			if sig := stop(); sig != 0 {
				fmt.Fprintf(os.Stderr, "branchfs: pull %s interrupted; no branch was made\n", loc)
				return exitStatus(sig)
			}
			if err != nil {
				return fmt.Errorf("pull %s: %w", loc, err)
			}
			view := filepath.Join(mnt, ctl.BranchPrefix+name)
			if asJSON {
				return json.NewEncoder(os.Stdout).Encode(map[string]any{"view": view, "stats": st})
			}
			fmt.Printf("pulled %s into %s: %d paths, %s; received %s\n", loc, view, st.Paths, remote.BytesOf(st.Bytes), remote.BytesOf(st.Received))
			return nil
		},
	}
	c.Flags().StringVar(&as, "as", "", "name of the new branch (default: the name it was pushed under)")
	c.Flags().StringVarP(&parent, "parent", "p", branch.MainName, "parent of the new branch")
	c.Flags().BoolVar(&force, "force", false, "pull even where the base differs from the branch's")
	c.Flags().IntVarP(&jobs, "jobs", "j", remote.DefaultJobs, "requests to keep in flight")
	c.Flags().BoolVar(&asJSON, "json", false, "print the new view and what was received as JSON")
	return c
}

// pullTarget makes branch name a child of parent on the mount at mnt,
// through the control file.
func pullTarget(mnt, parent, name string) remote.Target {
	parentView := mnt
	if parent != branch.MainName {
		parentView = filepath.Join(mnt, ctl.BranchPrefix+parent)
	}
	return remote.Target{
		ParentView: parentView,
		Create: func() (string, error) {
			if _, err := ctl.Command(parentView, ctl.CmdCreate+":"+ctl.QuoteArg(name)); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return "", fmt.Errorf("no branch %s under %s", parent, mnt)
				}
				if errors.Is(err, syscall.EEXIST) {
					return "", fmt.Errorf("a branch %s exists on %s (pull --as NAME names it otherwise)", name, mnt)
				}
				return "", ctl.Explain("create", name, err)
			}
			return filepath.Join(mnt, ctl.BranchPrefix+name), nil
		},
		Abort: func() error {
			_, err := ctl.Command(filepath.Join(mnt, ctl.BranchPrefix+name), ctl.CmdAbort)
			return err
		},
	}
}

// branchArg finds the view of a branch named by a path in it (MNT/@NAME),
// or by its name alone from inside its mount.
func branchArg(arg, op string) (view, name string, err error) {
	if root, n, err := findView(arg); err == nil && n != branch.MainName {
		return root, n, nil
	}
	if branch.ValidateName(arg) == nil {
		if mnt, _, err := mountRoot("."); err == nil {
			view = filepath.Join(mnt, ctl.BranchPrefix+arg)
			if _, err := os.Stat(view); err != nil {
				return "", "", fmt.Errorf("%s: no branch %s on %s", op, arg, mnt)
			}
			return view, arg, nil
		}
	}
	return "", "", fmt.Errorf("%s: %s is not a branch: give MNT/@NAME, or NAME from inside the mount", op, arg)
}

// parentOf returns the name and the view of the parent of the branch at
// view.
func parentOf(view, name string) (string, string, error) {
	st, err := ctl.ReadStatus(view, false)
	if err != nil {
		return "", "", err
	}
	mnt := filepath.Dir(view)
	for _, b := range st.Branches {
		if b.Name == name {
			if b.Parent == branch.MainName {
				return b.Parent, mnt, nil
			}
			return b.Parent, filepath.Join(mnt, ctl.BranchPrefix+b.Parent), nil
		}
	}
	return "", "", fmt.Errorf("no branch %s on %s", name, mnt)
}

// terminal is standard error where it is a terminal, for progress bars.
func terminal() io.Writer {
	if _, err := unix.IoctlGetTermios(int(os.Stderr.Fd()), unix.TCGETS); err != nil {
		return nil
	}
	return os.Stderr
}
