package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The help reads like a manual page: every command says what it does at
// length, the commands show examples and their exit statuses, usage lines
// leave the optional flags to the flag list, and the root tells the exit
// statuses, shell completion and the version.
func TestHelpIsAManual(t *testing.T) {
	root := newRoot()
	for _, want := range []string{"EXIT STATUS", "SHELL COMPLETION", "branchfs completion"} {
		if !strings.Contains(root.Long, want) {
			t.Errorf("branchfs --help does not tell %s", want)
		}
	}
	if root.Example == "" {
		t.Error("branchfs --help has no examples")
	}
	for _, c := range root.Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if c.GroupID == "" {
			t.Errorf("%s is in no group of the command list", c.Name())
		}
		if c.Long == "" {
			t.Errorf("branchfs %s --help: no long description", c.Name())
		}
		if c.Example == "" {
			t.Errorf("branchfs %s --help: no examples", c.Name())
		}
		if !strings.Contains(c.Long, "\nEXIT STATUS\n") {
			t.Errorf("branchfs %s --help: no EXIT STATUS", c.Name())
		}
		if strings.Contains(c.Use, "[--") {
			t.Errorf("branchfs %s: the usage line %q repeats optional flags", c.Name(), c.Use)
		}
	}
}

func TestVersion(t *testing.T) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "branchfs version ") || len(strings.TrimSpace(got)) == len("branchfs version") {
		t.Errorf("--version printed %q", got)
	}
}

// --base is required, and cobra says so before the command runs.
func TestMountNeedsBase(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"mount", t.TempDir()})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), `"base"`) {
		t.Errorf("mount without --base: %v", err)
	}
}

// Every command that takes a path says the same of one outside any
// branchfs mount, and changes nothing.
func TestOutsideAMount(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"create", "x", dir}, {"commit", dir}, {"abort", dir}, {"list", dir}, {"diff", dir}, {"unmount", dir},
		{"run", dir, "--", "true"}, {"speculate", "-c", "true", dir}, {"best-of-n", "-c", "true", dir},
		{"reflexion", dir, "--", "true"}, {"cascaded", dir, "--", "true"},
		{"tournament", "--judge", "echo 0", "-c", "true", dir}, {"tree", "-c", "true", dir},
		{"beam", "-c", "true", "--expand", "true", dir}, {"checkpoint", "x", dir, "1"},
		{"restore", "x", dir},
	} {
		root := newRootFor(args) // as main makes it
		root.SetArgs(args)
		err := root.Execute()
		if want := dir + " is not inside a branchfs mount"; err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("branchfs %s: %v, want an error ending in %q", strings.Join(args, " "), err, want)
		}
	}
}

// The names main looks commands up by are the commands' own, and each
// command made alone says in its help what it says among all the others.
func TestCommandNames(t *testing.T) {
	all := newRoot()
	for _, c := range commands {
		if got := c.make().Name(); got != c.name {
			t.Errorf("commands lists %s as %q", got, c.name)
		}
		help := func(root *cobra.Command) string {
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetArgs([]string{c.name, "--help"})
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			return out.String()
		}
		if alone, among := help(newRootFor([]string{c.name})), help(all); alone != among {
			t.Errorf("branchfs %s --help made alone:\n%s\namong the others:\n%s", c.name, alone, among)
		}
	}
	if n := len(newRootFor([]string{"create"}).Commands()); n != 1 {
		t.Errorf("the root for create has %d commands", n)
	}
}
