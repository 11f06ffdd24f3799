package cudago

import "errors"

// ErrClosed is returned by calls on a closed Device.
var ErrClosed = errors.New("cudago: the device is closed")
