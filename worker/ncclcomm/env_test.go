package ncclcomm

import "testing"

// The defaults fill in what the environment lacks and never override a
// value the user set, whatever it is.
func TestSetDefaults(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "0"},
		{map[string]string{"NCCL_CUMEM_ENABLE": "1"}, "1"},
		{map[string]string{"NCCL_CUMEM_ENABLE": ""}, ""},
	} {
		env := map[string]string{}
		for k, v := range tc.env {
			env[k] = v
		}
		setDefaults(func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			func(k, v string) error { env[k] = v; return nil })
		if got := env["NCCL_CUMEM_ENABLE"]; got != tc.want {
			t.Errorf("environment %v: NCCL_CUMEM_ENABLE=%q, want %q", tc.env, got, tc.want)
		}
	}
}
