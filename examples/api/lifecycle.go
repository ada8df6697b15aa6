// Drive vz from Go with the generated vz.api.v1 package (docs/api.md): wait for the daemon, up, status, exec,
// stop, delete, events. The Go twin of lifecycle.py; it imports nothing of vz but the committed Go package.
//
//	vz daemon start                      # a gRPC client cannot start the daemon itself
//	GO111MODULE=off GOPATH=$PWD/protocol/go:/usr/share/gocode go run examples/api/lifecycle.go [PROJECT_DIR]
//
// PROJECT_DIR holds a vz.json (default: examples/fake). The daemon's socket is $VZ_DAEMON_SOCKET, else
// $VZ_HOME/daemon/vz.sock (what `vz daemon start --json` prints as "socket"). Exit status: 0 when every step
// worked, 1 with the error otherwise.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "vz.dev/protocol/vz/api/v1"
)

// socketPath is where the daemon listens: VZ_DAEMON_SOCKET, else <VZ_HOME>/daemon/vz.sock.
func socketPath() (string, error) {
	if socket := os.Getenv("VZ_DAEMON_SOCKET"); socket != "" {
		return socket, nil
	}
	if home := os.Getenv("VZ_HOME"); home != "" {
		return filepath.Join(home, "daemon", "vz.sock"), nil
	}
	return "", errors.New("set VZ_HOME or VZ_DAEMON_SOCKET (`vz daemon start --json` prints the socket)")
}

// waitReady polls System.Status until the daemon answers: UNAVAILABLE means not serving yet.
func waitReady(ctx context.Context, conn *grpc.ClientConn) (*apiv1.DaemonStatus, error) {
	for {
		answer, err := apiv1.NewSystemClient(conn).Status(ctx, &apiv1.StatusRequest{})
		if status.Code(err) != codes.Unavailable {
			return answer, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the vz daemon did not become ready: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func run(project string) error {
	socket, err := socketPath()
	if err != nil {
		return err
	}
	// A missing socket fails at once, naming it (a dial would retry until its deadline).
	if _, err := os.Stat(socket); err != nil {
		return fmt.Errorf("no vz daemon socket at %s (%v); start the daemon with `vz daemon start`", socket, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dial := func(ctx context.Context, address string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", address)
	}
	conn, err := grpc.DialContext(ctx, "passthrough:///"+socket, grpc.WithInsecure(), grpc.WithContextDialer(dial))
	if err != nil {
		return err
	}
	defer conn.Close()
	daemon, err := waitReady(ctx, conn)
	if err != nil {
		return err
	}
	fmt.Printf("daemon: pid %d, vz %s\n", daemon.GetPid(), daemon.GetVersion())

	// The context says where the project is: the daemon selects the Environment as `vz` run there would.
	where := &apiv1.Context{Cwd: project}
	environments := apiv1.NewEnvironmentsClient(conn)

	// System.Events without follow: what happened so far, then the revision to resume from.
	start, err := lastRevision(ctx, conn, 0)
	if err != nil {
		return err
	}

	// Environments.Up: progress messages, then one result.
	up, err := environments.Up(ctx, &apiv1.UpRequest{Context: where})
	if err != nil {
		return err
	}
	for {
		message, err := up.Recv()
		if err != nil {
			return err
		}
		if progress := message.GetProgress(); progress != nil {
			if progress.GetEvent() == "step" && progress.GetStatus() != "started" {
				fmt.Printf("  %s: %s\n", progress.GetMessage(), progress.GetStatus())
			}
			continue
		}
		env := message.GetResult().GetEnvironment()
		fmt.Printf("up: Environment %s (%s) is %s\n", env.GetName(), env.GetId(), env.GetState())
		break
	}

	// Environments.Get: the status document, live from the driver.
	report, err := environments.Get(ctx, &apiv1.GetEnvironmentRequest{Context: where})
	if err != nil {
		return err
	}
	for _, machine := range report.GetEnvironments()[0].GetMachines() {
		fmt.Printf("machine %s: %s\n", machine.GetName(), machine.GetState())
	}

	// Machines.Exec: input, CloseSend() (the end of the command's input), output, then the result.
	if err := execute(ctx, conn, where); err != nil {
		return err
	}

	stop, err := environments.Stop(ctx, &apiv1.StopRequest{Context: where})
	if err != nil {
		return err
	}
	for {
		message, err := stop.Recv()
		if err != nil {
			return err
		}
		if result := message.GetResult(); result != nil {
			fmt.Printf("stop: %s\n", result.GetEnvironment().GetState())
			break
		}
	}
	del, err := environments.Delete(ctx, &apiv1.DeleteRequest{Context: where})
	if err != nil {
		return err
	}
	for {
		message, err := del.Recv()
		if err != nil {
			return err
		}
		if result := message.GetResult(); result != nil {
			fmt.Printf("delete: %s, %d Machine(s) removed\n", result.GetEnvironment().GetState(), len(result.GetMachines()))
			break
		}
	}

	// System.Events from where we started: typed operation events (call is an int64, not a double).
	events, err := apiv1.NewSystemClient(conn).Events(ctx, &apiv1.EventsRequest{FromRevision: &start})
	if err != nil {
		return err
	}
	operations := 0
	for {
		message, err := events.Recv()
		if err != nil {
			return err
		}
		if message.GetResult() != nil {
			break
		}
		if finished := message.GetEvent().GetOperationFinished(); finished != nil {
			operations++
			fmt.Printf("event %d: %s call %d %s\n", message.GetEvent().GetRevision(), finished.GetMethod(),
				finished.GetCall(), finished.GetStatus())
		}
	}
	fmt.Printf("events: %d operation(s) finished since revision %d\n", operations, start)
	return nil
}

func execute(ctx context.Context, conn *grpc.ClientConn, where *apiv1.Context) error {
	stream, err := apiv1.NewMachinesClient(conn).Exec(ctx)
	if err != nil {
		return err
	}
	start := &apiv1.ExecRequest{
		Context: where,
		Argv:    []string{"sh", "-c", `read line; echo "got $line"; echo oops >&2; exit 3`},
		Stdio:   []bool{false, false, false},
	}
	if err := stream.Send(&apiv1.ExecClientMessage{Message: &apiv1.ExecClientMessage_Start{Start: start}}); err != nil {
		return err
	}
	input := &apiv1.Chunk{Stream: 0, Data: []byte("hello\n")}
	if err := stream.Send(&apiv1.ExecClientMessage{Message: &apiv1.ExecClientMessage_Input{Input: input}}); err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	output := map[int32][]byte{}
	for {
		message, err := stream.Recv()
		if err != nil {
			return err
		}
		if result := message.GetResult(); result != nil {
			fmt.Printf("exec: exit %d, stdout %q, stderr %q\n", result.GetExitCode(), output[1], output[2])
			return nil
		}
		chunk := message.GetOutput()
		output[chunk.GetStream()] = append(output[chunk.GetStream()], chunk.GetData()...)
	}
}

func lastRevision(ctx context.Context, conn *grpc.ClientConn, from int64) (int64, error) {
	events, err := apiv1.NewSystemClient(conn).Events(ctx, &apiv1.EventsRequest{FromRevision: &from})
	if err != nil {
		return 0, err
	}
	for {
		message, err := events.Recv()
		if err == io.EOF {
			return 0, errors.New("System.Events ended without a result")
		}
		if err != nil {
			return 0, err
		}
		if result := message.GetResult(); result != nil {
			return result.GetRevision(), nil
		}
	}
}

func main() {
	project := "examples/fake"
	if len(os.Args) > 1 {
		project = os.Args[1]
	}
	absolute, err := filepath.Abs(project)
	if err == nil {
		err = run(absolute)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
}
