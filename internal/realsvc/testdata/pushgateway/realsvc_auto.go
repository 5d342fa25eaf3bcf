//go:build realsvc_auto

package main

import _ "github.com/memctl/memctl/auto"
