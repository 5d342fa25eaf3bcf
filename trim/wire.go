package trim

import "github.com/memctl/memctl/internal/trimwire"

func init() {
	trimwire.Request = func(t any, o trimwire.Origin) bool {
		tr, _ := t.(*Trimmer)
		return tr.request(o).ran
	}
	trimwire.OnTrim = func(t any, fn func()) {
		if tr, _ := t.(*Trimmer); tr != nil {
			tr.onTrim.Store(&fn)
		}
	}
	trimwire.StartAutoBurst = func(t any, cfg any) (trimwire.AutoBurst, error) {
		tr, _ := t.(*Trimmer)
		c, _ := cfg.(AutoBurstConfig)
		a, err := startAutoBurst(tr, c)
		if a == nil {
			return nil, err
		}
		return a, err
	}
}
