//go:build !linux

package main

import (
	"errors"
	"os/exec"
)

type cgroupParent struct {
	dir     string
	version int
}

type cgroup struct {
	dir     string
	version int
}

func findCgroupParent() (*cgroupParent, error) { return nil, errors.ErrUnsupported }

func (p *cgroupParent) newChild(string, int64) (*cgroup, error) { return nil, errors.ErrUnsupported }

func (g *cgroup) wrap(*exec.Cmd) {}

func (g *cgroup) oomKills() (int64, error) { return 0, errors.ErrUnsupported }

func (g *cgroup) remove() error { return nil }
