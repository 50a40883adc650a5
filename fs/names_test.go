package fs_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Branch names are as free as file names: spaces, "+", a leading dot,
// UTF-8, quotes, a newline, 254 bytes. Each goes through the CLI and the
// control file, as written or quoted, shows at MNT/@NAME, keeps its own
// writes, is listed as it is (quoted in the text table) and commits.
func TestFreeBranchNames(t *testing.T) {
	m := newMount(t, "")
	names := []string{"my branch", "c++", ".hidden", "名前", `it's "quoted"`, "two\nlines", " padded ", strings.Repeat("é", 127)}
	for _, name := range names {
		out := m.ok("create", name, m.mnt)
		if out != m.view(name)+"\n" {
			t.Errorf("create %q printed %q", name, out)
		}
		writeFile(t, filepath.Join(m.view(name), "file"), name)
	}
	// Written by hand to the control file: as it is, and quoted.
	ctl := filepath.Join(m.mnt, ".branchfs_ctl")
	writeFile(t, ctl, "create:hand made\n")
	writeFile(t, ctl, `create:"\tquoted\u00e9"`)
	for _, name := range []string{"hand made", "\tquotedé"} {
		if _, err := os.Stat(m.view(name)); err != nil {
			t.Errorf("control file: %v", err)
		}
	}
	var list []struct{ Name, State string }
	must(t, json.Unmarshal([]byte(m.ok("list", "--json", m.mnt)), &list))
	got := map[string]bool{}
	for _, b := range list {
		got[b.Name] = true
	}
	for _, name := range names {
		if !got[name] {
			t.Errorf("list --json lacks %q: %v", name, list)
		}
		if data, err := os.ReadFile(filepath.Join(m.view(name), "file")); err != nil || string(data) != name {
			t.Errorf("@%q/file = %q, %v", name, data, err)
		}
	}
	text := m.ok("list", m.mnt)
	if !strings.Contains(text, `"two\nlines"`) || !strings.Contains(text, `"my branch"`) || strings.Count(text, "\n") != len(names)+4 {
		t.Errorf("list:\n%s", text)
	}
	// An error names the branch quoted, on one line.
	_, errOut, code := m.cli("create", "two\nlines", m.mnt)
	if code != 1 || !strings.Contains(errOut, `"two\nlines"`) || strings.Count(errOut, "\n") != 1 {
		t.Errorf("duplicate: exit %d: %q", code, errOut)
	}
	m.ok("commit", m.view("my branch"))
	if data, _ := os.ReadFile(filepath.Join(m.base, "file")); string(data) != "my branch" {
		t.Errorf("base file after commit = %q", data)
	}
	for _, name := range append(names[1:], "hand made", "\tquotedé") {
		_, errOut, code := m.cli("abort", m.view(name))
		if code != 3 && code != 0 {
			t.Errorf("abort %q: exit %d: %s", name, code, errOut)
		}
	}
}

// Every command takes --storage (and --store), as the reference's
// clients pass it: the mount's own store is accepted, another refused in
// one line, and list finds the mount by its store alone.
func TestStorageEverywhere(t *testing.T) {
	m := newMount(t, "")
	s := "--storage=" + m.store
	view := strings.TrimSpace(m.ok("create", "feature1", m.mnt, "-p", "main", "--storage", m.store))
	writeFile(t, filepath.Join(view, "new"), "x")
	for _, args := range [][]string{
		{"list", s}, {"list", m.mnt, s}, {"diff", view, s}, {"commit", view, s},
		{"run", s, m.mnt, "--", "true"}, {"speculate", s, "-c", "true", m.mnt},
	} {
		out := m.ok(args...)
		if args[0] == "list" && !strings.Contains(out, "feature1") {
			t.Errorf("%q: %s", args, out)
		}
	}
	m.create("gone")
	m.ok("abort", m.view("gone"), s)
	other := t.TempDir()
	for _, args := range [][]string{{"list", m.mnt, "--storage", other}, {"create", "x", m.mnt, "--storage", other}, {"list", "--storage", other}, {"list"}} {
		_, errOut, code := m.cli(args...)
		if code != 1 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: exit %d: %q", args, code, errOut)
		}
	}
	m.ok("unmount", m.mnt, s)
	m.mounted = false
}
