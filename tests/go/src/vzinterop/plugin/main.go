// vz-go-plugin: a Runtime Protocol v1 plugin written with HashiCorp go-plugin, used by vz's interop
// tests as a real Go peer. Machines are in-memory records; Exec runs host processes.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "vz.dev/protocol/devsy/runtime/v1"
)

var handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "DEVSY_RUNTIME_PLUGIN",
	MagicCookieValue: "devsy-runtime-v1",
}

type machine struct {
	id      string
	created string
	started string
	status  string
	labels  map[string]string
	user    string
}

type driver struct {
	pb.UnimplementedRuntimeDriverServer
	mu       sync.Mutex
	machines map[string]*machine
}

func rtErr(code codes.Code, rc pb.RuntimeErrorCode, msg string) error {
	st := status.New(code, msg)
	withDetail, err := st.WithDetails(&pb.RuntimeError{Code: rc, Message: msg, Retryable: rc == pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_UNAVAILABLE})
	if err != nil {
		return st.Err()
	}
	return withDetail.Err()
}

func notFound(id string) error {
	return rtErr(codes.NotFound, pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_NOT_FOUND, fmt.Sprintf("workspace %q does not exist", id))
}

func invalid(msg string) error {
	return rtErr(codes.InvalidArgument, pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_INVALID_ARGUMENT, msg)
}

func now() string { return time.Now().UTC().Format(time.RFC3339Nano) }

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (d *driver) Info(ctx context.Context, req *pb.InfoRequest) (*pb.InfoResponse, error) {
	return &pb.InfoResponse{
		ApiMajor: 1, ApiMinor: 2,
		DriverName: "go-reference", DriverVersion: "0.1.0",
		RuntimeName: "host-process", RuntimeVersion: "1",
		Capabilities: &pb.Capabilities{
			MountTypes:   []pb.MountType{pb.MountType_MOUNT_TYPE_BIND},
			RecreateMode: pb.RecreateMode_RECREATE_MODE_DELETE,
		},
	}, nil
}

func (d *driver) Preflight(ctx context.Context, req *pb.PreflightRequest) (*pb.PreflightResponse, error) {
	return &pb.PreflightResponse{}, nil
}

func (d *driver) TargetArchitecture(ctx context.Context, req *pb.TargetArchitectureRequest) (*pb.TargetArchitectureResponse, error) {
	return &pb.TargetArchitectureResponse{Architecture: "amd64"}, nil
}

func (d *driver) Find(ctx context.Context, req *pb.FindRequest) (*pb.FindResponse, error) {
	if req.WorkspaceId == "" {
		return nil, invalid("workspace_id is empty")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.machines[req.WorkspaceId]
	if !ok {
		return &pb.FindResponse{Found: false}, nil
	}
	return &pb.FindResponse{Found: true, Container: &pb.ContainerDetails{
		Id: m.id, CreatedAt: m.created,
		State:  &pb.ContainerState{Status: m.status, StartedAt: m.started},
		Config: &pb.ContainerConfig{Labels: m.labels, User: m.user},
	}}, nil
}

func (d *driver) RunImage(ctx context.Context, req *pb.RunImageRequest) (*pb.RunImageResponse, error) {
	if req.WorkspaceId == "" {
		return nil, invalid("workspace_id is empty")
	}
	if req.Image == "" {
		return nil, invalid("image is empty")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.machines[req.WorkspaceId]; ok && !req.AllowRecreate {
		return nil, rtErr(codes.AlreadyExists, pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_ALREADY_EXISTS, "workspace already exists")
	}
	labels := map[string]string{}
	for _, l := range req.Labels {
		k, v := l, ""
		for i := 0; i < len(l); i++ {
			if l[i] == '=' {
				k, v = l[:i], l[i+1:]
				break
			}
		}
		labels[k] = v
	}
	t := now()
	d.machines[req.WorkspaceId] = &machine{id: newID(), created: t, started: t, status: "running", labels: labels, user: req.User}
	return &pb.RunImageResponse{}, nil
}

func (d *driver) setStatus(id, st string) error {
	if id == "" {
		return invalid("workspace_id is empty")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	m, ok := d.machines[id]
	if !ok {
		return notFound(id)
	}
	if st == "running" && m.status != "running" {
		m.started = now()
	}
	m.status = st
	return nil
}

func (d *driver) Start(ctx context.Context, req *pb.StartRequest) (*pb.StartResponse, error) {
	return &pb.StartResponse{}, d.setStatus(req.WorkspaceId, "running")
}

func (d *driver) Stop(ctx context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	return &pb.StopResponse{}, d.setStatus(req.WorkspaceId, "stopped")
}

func (d *driver) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	if req.WorkspaceId == "" {
		return nil, invalid("workspace_id is empty")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.machines, req.WorkspaceId)
	return &pb.DeleteResponse{}, nil
}

func (d *driver) Exec(stream pb.RuntimeDriver_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return invalid("stream ended before the start frame")
	}
	start := first.GetStart()
	if start == nil || len(start.Argv) == 0 {
		return invalid("the first frame must be a start with a non-empty argv")
	}
	d.mu.Lock()
	m, ok := d.machines[start.WorkspaceId]
	running := ok && m.status == "running"
	d.mu.Unlock()
	if !ok {
		return notFound(start.WorkspaceId)
	}
	if !running {
		return rtErr(codes.FailedPrecondition, pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_FAILED_PRECONDITION, "workspace is stopped")
	}
	cmd := exec.CommandContext(stream.Context(), start.Argv[0], start.Argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Dir = start.Workdir
	for k, v := range start.Environment {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return rtErr(codes.Internal, pb.RuntimeErrorCode_RUNTIME_ERROR_CODE_RUNTIME_FAILURE, "cannot start command: "+err.Error())
	}
	go func() {
		defer stdin.Close()
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			if data := msg.GetStdin(); data != nil {
				if _, err := stdin.Write(data); err != nil {
					return
				}
			}
			if msg.GetCloseStdin() != nil {
				return
			}
		}
	}()
	out := make(chan *pb.ExecServerMessage, 4)
	var wg sync.WaitGroup
	pump := func(r io.Reader, isErr bool) {
		defer wg.Done()
		buf := make([]byte, 32768)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				chunk := &pb.OutputChunk{Data: append([]byte(nil), buf[:n]...)}
				if isErr {
					out <- &pb.ExecServerMessage{Payload: &pb.ExecServerMessage_Stderr{Stderr: chunk}}
				} else {
					out <- &pb.ExecServerMessage{Payload: &pb.ExecServerMessage_Stdout{Stdout: chunk}}
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(stdout, false)
	go pump(stderr, true)
	go func() { wg.Wait(); close(out) }()
	for msg := range out {
		if err := stream.Send(msg); err != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			return err
		}
	}
	werr := cmd.Wait()
	exit := &pb.ExecExit{}
	if werr != nil {
		if ee, ok := werr.(*exec.ExitError); ok {
			ws := ee.Sys().(syscall.WaitStatus)
			if ws.Signaled() {
				exit.Signal = "SIG" + ws.Signal().String()
				exit.ExitCode = int32(128 + int(ws.Signal()))
			} else {
				exit.ExitCode = int32(ws.ExitStatus())
			}
		} else if stream.Context().Err() != nil {
			return status.FromContextError(stream.Context().Err()).Err()
		}
	}
	return stream.Send(&pb.ExecServerMessage{Payload: &pb.ExecServerMessage_Exit{Exit: exit}})
}

// runtimePlugin adapts the driver to go-plugin's GRPCPlugin interface.
type runtimePlugin struct {
	plugin.NetRPCUnsupportedPlugin
	impl *driver
}

func (p *runtimePlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterRuntimeDriverServer(s, p.impl)
	return nil
}

func (p *runtimePlugin) GRPCClient(ctx context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return pb.NewRuntimeDriverClient(c), nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--crash-before-handshake" {
		fmt.Fprintln(os.Stderr, "vz-go-plugin: crashing on request")
		os.Exit(3)
	}
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: handshake,
		Plugins:         map[string]plugin.Plugin{"runtime": &runtimePlugin{impl: &driver{machines: map[string]*machine{}}}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
