// Package token checks that a gRPC caller holds the job token, the one
// place where a call is found authenticated (Authenticated): over TLS, by
// the proof of the token that the connection made in its handshake
// (jobtls.ServerCredentials; the token itself never travels); without TLS
// (the agent's local socket, tests), by the token attached to every call
// (PerRPC). Calls that are not are refused with PermissionDenied.
package token

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gotrain/gotrain/internal/jobtls"
)

// MetadataKey is the gRPC metadata key that holds the token.
const MetadataKey = "gotrain-job-token"

// Generate returns a new random token.
func Generate() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux.
	return hex.EncodeToString(b)
}

// PerRPC returns call credentials that attach tok to every call. They do not
// require transport security: agents and workers talk over loopback, a local
// socket, or the cluster network the user chose.
func PerRPC(tok string) credentials.PerRPCCredentials { return perRPC(tok) }

type perRPC string

func (p perRPC) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{MetadataKey: string(p)}, nil
}
func (perRPC) RequireTransportSecurity() bool { return false }

// DialOption is PerRPC as a grpc.DialOption.
func DialOption(tok string) grpc.DialOption { return grpc.WithPerRPCCredentials(PerRPC(tok)) }

// ServerOptions returns interceptors that check every unary and streaming call.
func ServerOptions(tok string) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx, tok); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context(), tok); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

func check(ctx context.Context, want string) error { return Authenticated(ctx, want) }

// Authenticated says whether the caller of ctx (a server handler's
// context) holds the job token want: its TLS connection proved it
// (jobtls.ProvenPeer), or, on a connection without TLS, the call carries
// it. A hook that marks a connection authenticated belongs here.
func Authenticated(ctx context.Context, want string) error {
	if _, ok := jobtls.ProvenPeer(ctx); ok {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(MetadataKey)
	if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), []byte(want)) != 1 {
		return status.Error(codes.PermissionDenied, "missing or wrong job token: this caller does not belong to this job (check "+MetadataKey+" / GOTRAIN_JOB_TOKEN)")
	}
	return nil
}
