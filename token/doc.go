// Package token issues, verifies and redeems single-use tokens.
//
// A token is a compact HS256 JWT whose jti is a sonyflake ID. Issue
// signs it and records it in a store.Store until its exp; Redeem verifies
// the signature and claims, then asks the store to delete the record in
// one atomic step, so exactly one caller ever redeems a given token, even
// across many instances that share a Redis.
//
// RedeemRecord is the same redemption for a token whose one execution is
// recorded beside it (package idempotency builds on it): it opens the
// record in the step that redeems the token, and a duplicate gets the
// record instead of ErrUsed, even after the token's exp. Parse verifies a
// token without the store; for a token whose exp has passed it returns the
// claims with ErrExpired, for finishing what the token started before then.
//
// # Claims
//
// Every token carries jti (the ID, a sonyflake ID in decimal), iat, exp,
// pur (its purpose, matching ^[A-Za-z0-9._:/-]{1,64}$, "default" when none
// is given) and, when it is bound to a user or session, sub. The JWT
// header carries the kid of the key that signed it.
//
// # Security model
//
//   - Only HS256 is accepted; the algorithm is pinned, so "none" and
//     asymmetric-key confusion are refused.
//   - Keys form a ring: the first key signs, every key verifies. Rotate by
//     putting a new key first and keeping the old one until the tokens it
//     signed have expired (at most the max TTL). See ParseKeys for the
//     REPLAYGUARD_SIGNING_KEYS format; keys must be at least MinKeyLen
//     bytes.
//   - The signature and exp are checked before the store is touched, so a
//     forged or expired token costs no store round trip. Purpose and
//     subject are compared from the signed claims first, and again by the
//     store, atomically, before it deletes the record.
//   - A purpose or subject mismatch leaves the token valid: the rightful
//     caller can still redeem it.
//   - Errors never contain key material; Key's String method prints only
//     the kid.
//
// # Failure
//
// A store that cannot confirm an operation makes Issue and Redeem return
// the store's error, which wraps store.ErrUnavailable (or is store.ErrFull
// for a bounded store that is full). The outcome is then unknown and the
// caller must treat it as a refusal: a protected action must never run on
// store.ErrUnavailable.
//
// # IDs
//
// IDs come from github.com/sony/sonyflake (v1): 39 bits of time in 10ms
// units, an 8-bit sequence and a 16-bit machine ID, so one Service issues
// at most 25,600 IDs a second and waits for the next 10ms tick beyond
// that. Every instance that shares a store needs its own machine ID (see
// WithMachineID); a collision is refused by the store's set-if-absent and
// retried with a fresh ID. Without WithMachineID the machine ID is the
// lower 16 bits of the host's private IPv4 address or, on a host without
// one (a container, an IPv6-only host, a CI runner), a random one, which
// Service.MachineID reports so that a program can log it, as the server
// does.
//
// # Example
//
// A complete program: issue a token for a checkout, redeem it once, and
// see the second attempt refused.
//
//	package main
//
//	import (
//		"context"
//		"errors"
//		"fmt"
//		"log"
//		"os"
//
//		"github.com/replayguard/replayguard/store/memory"
//		"github.com/replayguard/replayguard/token"
//	)
//
//	func main() {
//		// "kid:base64key,...", e.g. from: openssl rand -base64 32
//		keys, err := token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		st := memory.New()
//		defer st.Close()
//		svc, err := token.New(st, keys, token.WithMachineID(1))
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		ctx := context.Background()
//		is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
//		if err != nil {
//			log.Fatal(err) // store.ErrUnavailable or store.ErrFull: nothing was issued
//		}
//		// Hand is.Token to the client; it comes back with the checkout.
//
//		claims, err := svc.Redeem(ctx, is.Token, "checkout", "")
//		if err != nil {
//			log.Fatal(err) // refuse the checkout
//		}
//		fmt.Println("checkout accepted, token", claims.ID)
//
//		_, err = svc.Redeem(ctx, is.Token, "checkout", "")
//		fmt.Println("replay refused:", errors.Is(err, token.ErrUsed))
//	}
//
// To share tokens between instances, replace memory.New with the Redis
// store from store/redis. To protect an application's routes with
// tokens, see package guard; to serve them over HTTP to other backends
// and browsers, package handlers.
package token
