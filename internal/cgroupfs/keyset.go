package cgroupfs

import "bytes"

// keySlots is the room of a keySet's table; past keySlots*3/4 keys a
// keySet moves to a map.
const keySlots = 256

// keySet is the set of the keys of one file, each a subslice of the file,
// held as offsets in an open-addressing table on the stack: the keys of a
// memory.stat file are told apart without allocating. A file of more keys
// than the table holds goes on in a map. The zero value is empty.
type keySet struct {
	slots [keySlots]struct{ start, end uint32 } // end 0: empty
	n     int
	more  map[string]bool
}

// add adds key, a subslice of file, and reports false when it was there.
func (s *keySet) add(file, key []byte) bool {
	if s.more != nil {
		if s.more[string(key)] {
			return false
		}
		s.more[string(key)] = true
		return true
	}
	start := uint32(cap(file) - cap(key)) // key's offset in file
	h := uint32(2166136261)
	for _, c := range key {
		h = (h ^ uint32(c)) * 16777619
	}
	for i := h % keySlots; ; i = (i + 1) % keySlots {
		sl := &s.slots[i]
		if sl.end == 0 {
			sl.start, sl.end = start, start+uint32(len(key))
			break
		}
		if bytes.Equal(file[sl.start:sl.end], key) {
			return false
		}
	}
	if s.n++; s.n >= keySlots*3/4 {
		s.more = make(map[string]bool, 2*s.n)
		for _, sl := range s.slots {
			if sl.end != 0 {
				s.more[string(file[sl.start:sl.end])] = true
			}
		}
	}
	return true
}
