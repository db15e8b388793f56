package limitstore

import "github.com/vmihailenco/msgpack/v5"

func marshalDays(r *taskDays) ([]byte, error) { return msgpack.Marshal(r) }

func unmarshalDays(data []byte, r *taskDays) error { return msgpack.Unmarshal(data, r) }
