// vz-go-api: a vz.api.v1 client written with grpc-go and the committed Go package (protocol/go), used by vz's
// interop tests as a third-party client. It dials the daemon's socket, runs one scenario and prints one JSON
// object on stdout; it exits 1 when the scenario cannot run.
//
//	vz-go-api SOCKET PROJECT_DIR closesend|cancel|error|watch
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	runtimev1 "vz.dev/protocol/devsy/runtime/v1"
	apiv1 "vz.dev/protocol/vz/api/v1"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "vz-go-api: "+format+"\n", args...)
	os.Exit(1)
}

func emit(v interface{}) {
	out, err := json.Marshal(v)
	if err != nil {
		fail("%v", err)
	}
	fmt.Println(string(out))
}

func start(project string, script string) *apiv1.ExecClientMessage {
	return &apiv1.ExecClientMessage{Message: &apiv1.ExecClientMessage_Start{Start: &apiv1.ExecRequest{
		Context: &apiv1.Context{Cwd: project},
		Argv:    []string{"sh", "-c", script},
		Stdio:   []bool{false, false, false},
	}}}
}

// closeSend: the usual idiom for a bidirectional call: send the input, CloseSend(), read to the result.
func closeSend(ctx context.Context, conn *grpc.ClientConn, project string) {
	stream, err := apiv1.NewMachinesClient(conn).Exec(ctx)
	if err != nil {
		fail("Exec: %v", err)
	}
	if err := stream.Send(start(project, "cat; echo done; exit 5")); err != nil {
		fail("send start: %v", err)
	}
	input := &apiv1.ExecClientMessage{Message: &apiv1.ExecClientMessage_Input{Input: &apiv1.Chunk{Stream: 0, Data: []byte("hello\n")}}}
	if err := stream.Send(input); err != nil {
		fail("send input: %v", err)
	}
	if err := stream.CloseSend(); err != nil {
		fail("CloseSend: %v", err)
	}
	output := []byte{}
	for {
		message, err := stream.Recv()
		if err == io.EOF {
			fail("the stream ended without a result")
		}
		if err != nil {
			emit(map[string]interface{}{"scenario": "closesend", "code": status.Code(err).String(), "message": status.Convert(err).Message(), "output": string(output)})
			return
		}
		if result := message.GetResult(); result != nil {
			emit(map[string]interface{}{"scenario": "closesend", "code": "OK", "output": string(output), "exit_code": result.GetExitCode()})
			return
		}
		output = append(output, message.GetOutput().GetData()...)
	}
}

// cancel: the RPC's own cancel (the context) once the command has started.
func cancel(ctx context.Context, conn *grpc.ClientConn, project string) {
	callCtx, stop := context.WithCancel(ctx)
	defer stop()
	stream, err := apiv1.NewMachinesClient(conn).Exec(callCtx)
	if err != nil {
		fail("Exec: %v", err)
	}
	if err := stream.Send(start(project, "echo started; exec sleep 600")); err != nil {
		fail("send start: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		fail("the first output: %v", err)
	}
	stop()
	_, err = stream.Recv()
	emit(map[string]interface{}{"scenario": "cancel", "first": string(first.GetOutput().GetData()), "code": status.Code(err).String()})
}

// typedError: a failed call carries both typed details.
func typedError(ctx context.Context, conn *grpc.ClientConn, project string) {
	name := "no-such-environment"
	_, err := apiv1.NewEnvironmentsClient(conn).Get(ctx, &apiv1.GetEnvironmentRequest{Context: &apiv1.Context{Cwd: project}, Environment: &name})
	found := map[string]interface{}{"scenario": "error", "code": status.Code(err).String()}
	for _, detail := range status.Convert(err).Details() {
		switch d := detail.(type) {
		case *apiv1.ErrorInfo:
			found["kind"] = d.GetKind()
			found["exit_code"] = d.GetExitCode()
		case *runtimev1.RuntimeError:
			found["runtime_code"] = d.GetCode().String()
		}
	}
	emit(found)
}

// watchResume: a watch cancelled after two events and resumed from the last revision it saw continues with
// exactly the event that followed (nothing lost, nothing repeated).
func watchResume(ctx context.Context, conn *grpc.ClientConn) {
	read := func(from int64, n int) []int64 {
		callCtx, stop := context.WithCancel(ctx)
		defer stop()
		stream, err := apiv1.NewEnvironmentsClient(conn).Watch(callCtx, &apiv1.WatchRequest{FromRevision: &from})
		if err != nil {
			fail("Watch: %v", err)
		}
		revisions := []int64{}
		for len(revisions) < n {
			message, err := stream.Recv()
			if err != nil {
				fail("Watch from %d: %v", from, err)
			}
			revisions = append(revisions, message.GetEvent().GetRevision())
		}
		return revisions
	}
	all := read(0, 3)
	first := read(0, 2)
	resumed := read(first[len(first)-1], 1)
	emit(map[string]interface{}{"scenario": "watch", "all": all, "first": first, "resumed": resumed})
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: vz-go-api SOCKET PROJECT_DIR closesend|cancel|error|watch")
	}
	socket, project, scenario := os.Args[1], os.Args[2], os.Args[3]
	ctx, done := context.WithTimeout(context.Background(), 120*time.Second)
	defer done()
	dial := func(ctx context.Context, address string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", address)
	}
	conn, err := grpc.DialContext(ctx, "passthrough:///"+socket, grpc.WithInsecure(), grpc.WithContextDialer(dial), grpc.WithBlock())
	if err != nil {
		fail("dial %s: %v", socket, err)
	}
	defer conn.Close()
	switch scenario {
	case "closesend":
		closeSend(ctx, conn, project)
	case "cancel":
		cancel(ctx, conn, project)
	case "error":
		typedError(ctx, conn, project)
	case "watch":
		watchResume(ctx, conn)
	default:
		fail("unknown scenario %q", scenario)
	}
}
