package token

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/sony/sonyflake"

	"github.com/replayguard/replayguard/store/memory"
)

// host plays a host's addresses for sonyflake's default machine ID: a
// private IPv4 address whose lower 16 bits are privateID, or none, or a
// failure of another kind; the host's real addresses are never read.
func host(t *testing.T, privateID uint16, defaultErr error) {
	t.Helper()
	old := newSonyflake
	t.Cleanup(func() { newSonyflake = old })
	newSonyflake = func(st sonyflake.Settings) (*sonyflake.Sonyflake, error) {
		if st.MachineID == nil { // sonyflake's default: the private IPv4 address
			if defaultErr != nil {
				return nil, defaultErr
			}
			st.MachineID = func() (uint16, error) { return privateID, nil }
		}
		return old(st)
	}
}

// TestMachineIDFallback: token.New(st, keys) without WithMachineID works
// on a host without a private IPv4 address (a container, IPv6 only, CI),
// under a random machine ID that MachineID reports, as the server does.
func TestMachineIDFallback(t *testing.T) {
	keys, err := ParseKeys("k1:" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=")
	if err != nil {
		t.Fatal(err)
	}
	set := uint16(4242)
	tests := []struct {
		name       string
		privateID  uint16
		defaultErr error
		machineID  *uint16
		wantID     *uint16 // nil: any ID
		wantRandom bool
		wantErr    error
	}{
		{"a private IPv4 address: its lower 16 bits", 0x0307, nil, nil, ptr(0x0307), false, nil},
		{"no private IPv4 address: a random ID, reported", 0, sonyflake.ErrNoPrivateAddress, nil, nil, true, nil},
		{"no private IPv4 address but WithMachineID: that ID", 0, sonyflake.ErrNoPrivateAddress, &set, &set, false, nil},
		{"a private IPv4 address and WithMachineID: that ID", 0x0307, nil, &set, &set, false, nil},
		{"another sonyflake failure is an error, not a random ID", 0, sonyflake.ErrStartTimeAhead, nil, nil, false, sonyflake.ErrStartTimeAhead},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host(t, tc.privateID, tc.defaultErr)
			st := memory.New()
			t.Cleanup(func() { _ = st.Close() })
			var opts []Option
			if tc.machineID != nil {
				opts = append(opts, WithMachineID(*tc.machineID))
			}
			svc, err := New(st, keys, opts...)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("New = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			id, random := svc.MachineID()
			if random != tc.wantRandom || (tc.wantID != nil && id != *tc.wantID) {
				t.Fatalf("MachineID = %d, %v; want %v, random %v", id, random, tc.wantID, tc.wantRandom)
			}
			is, err := svc.Issue(context.Background(), IssueRequest{Purpose: "checkout"})
			if err != nil {
				t.Fatalf("Issue: %v", err)
			}
			jti, err := strconv.ParseUint(is.ID, 10, 64)
			if err != nil || sonyflake.MachineID(jti) != uint64(id) {
				t.Fatalf("token ID %s carries machine ID %d, want %d", is.ID, sonyflake.MachineID(jti), id)
			}
			if _, err := svc.Redeem(context.Background(), is.Token, "checkout", ""); err != nil {
				t.Fatalf("Redeem: %v", err)
			}
		})
	}
}

func ptr(v uint16) *uint16 { return &v }
