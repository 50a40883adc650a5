module github.com/branchfs/branchfs

go 1.26.8

require (
	github.com/google/renameio/v2 v2.0.2 // indirect
	github.com/hanwen/go-fuse/v2 v2.12.1 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
