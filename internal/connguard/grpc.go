package connguard

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// GRPCServerOptions mark the connection of every call that reaches them
// authenticated in g (its LocalAddr and Addr: the gRPC peer). Chain them
// right after the interceptors that check a call's credentials, so that
// only a call found valid marks its connection. A call whose connection
// finds the authenticated budget full fails with Unavailable (its
// connection is closed).
func GRPCServerOptions(g *Guard) []grpc.ServerOption {
	mark := func(ctx context.Context) error {
		p, ok := peer.FromContext(ctx)
		if !ok {
			return nil
		}
		if err := g.MarkAuthenticated(p.LocalAddr, p.Addr); err != nil {
			return status.Errorf(codes.Unavailable, "%s holds its maximum of connections (%d authenticated): try again later", g.name, g.lim.Authenticated)
		}
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := mark(ctx); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := mark(ss.Context()); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
