//go:build !linux

package limits

import "errors"

func newFollower() (follower, error) {
	return nil, errors.New("no inotify off Linux")
}
