// vz-go-host: a Runtime Protocol v1 host written with HashiCorp go-plugin, used by vz's interop tests as a
// real Go peer. It launches the plugin given on the command line, runs a fixed scenario and prints one JSON
// object per step on stdout; it exits 1 when a step fails.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "vz.dev/protocol/devsy/runtime/v1"
)

type runtimePlugin struct {
	plugin.NetRPCUnsupportedPlugin
}

func (p *runtimePlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error { return nil }

func (p *runtimePlugin) GRPCClient(ctx context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (interface{}, error) {
	return pb.NewRuntimeDriverClient(c), nil
}

type argList []string

func (a *argList) String() string     { return strings.Join(*a, " ") }
func (a *argList) Set(v string) error { *a = append(*a, v); return nil }

var failed bool

func report(step string, ok bool, fields map[string]interface{}) {
	if fields == nil {
		fields = map[string]interface{}{}
	}
	fields["step"] = step
	fields["ok"] = ok
	if !ok {
		failed = true
	}
	line, _ := json.Marshal(fields)
	fmt.Println(string(line))
}

func execOnce(c pb.RuntimeDriverClient, ws string, argv []string, input []byte) ([]byte, []byte, *pb.ExecExit, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := c.Exec(ctx)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if err := stream.Send(&pb.ExecClientMessage{Payload: &pb.ExecClientMessage_Start{Start: &pb.ExecStart{WorkspaceId: ws, Argv: argv}}}); err != nil {
		return nil, nil, nil, 0, err
	}
	go func() {
		for off := 0; off < len(input); off += 32768 {
			end := off + 32768
			if end > len(input) {
				end = len(input)
			}
			if stream.Send(&pb.ExecClientMessage{Payload: &pb.ExecClientMessage_Stdin{Stdin: input[off:end]}}) != nil {
				return
			}
		}
		_ = stream.Send(&pb.ExecClientMessage{Payload: &pb.ExecClientMessage_CloseStdin{CloseStdin: &pb.CloseStdin{}}})
		_ = stream.CloseSend()
	}()
	var stdout, stderr bytes.Buffer
	var exit *pb.ExecExit
	maxFrame := 0
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return stdout.Bytes(), stderr.Bytes(), exit, maxFrame, err
		}
		if exit != nil {
			return nil, nil, nil, 0, fmt.Errorf("frame after exit")
		}
		switch p := msg.Payload.(type) {
		case *pb.ExecServerMessage_Stdout:
			stdout.Write(p.Stdout.Data)
			if len(p.Stdout.Data) > maxFrame {
				maxFrame = len(p.Stdout.Data)
			}
		case *pb.ExecServerMessage_Stderr:
			stderr.Write(p.Stderr.Data)
		case *pb.ExecServerMessage_Exit:
			exit = p.Exit
		}
	}
	return stdout.Bytes(), stderr.Bytes(), exit, maxFrame, nil
}

func main() {
	pluginPath := flag.String("plugin", "", "plugin executable")
	autoMTLS := flag.Bool("automtls", false, "negotiate AutoMTLS")
	ws := flag.String("workspace", "go-host-workspace", "workspace id to use")
	image := flag.String("image", "vz:default", "image for RunImage")
	var pluginArgs argList
	flag.Var(&pluginArgs, "plugin-arg", "argument for the plugin (repeatable)")
	flag.Parse()

	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "DEVSY_RUNTIME_PLUGIN", MagicCookieValue: "devsy-runtime-v1"},
		Plugins:          map[string]plugin.Plugin{"runtime": &runtimePlugin{}},
		Cmd:              exec.Command(*pluginPath, pluginArgs...),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         *autoMTLS,
		Logger:           hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn}),
		StartTimeout:     15 * time.Second,
	})
	defer client.Kill()
	t0 := time.Now()
	rpcClient, err := client.Client()
	if err != nil {
		report("connect", false, map[string]interface{}{"error": err.Error()})
		os.Exit(1)
	}
	raw, err := rpcClient.Dispense("runtime")
	if err != nil {
		report("dispense", false, map[string]interface{}{"error": err.Error()})
		os.Exit(1)
	}
	c := raw.(pb.RuntimeDriverClient)
	ctx := context.Background()

	info, err := c.Info(ctx, &pb.InfoRequest{SupportsRecreateOnRun: true})
	if err != nil {
		report("info", false, map[string]interface{}{"error": err.Error()})
		os.Exit(1)
	}
	report("info", info.ApiMajor == 1 && info.DriverName != "", map[string]interface{}{
		"api_major": info.ApiMajor, "api_minor": info.ApiMinor, "driver_name": info.DriverName,
		"recreate_mode": info.GetCapabilities().GetRecreateMode().String(), "ms": time.Since(t0).Milliseconds(),
		"negotiated_protocol": string(client.Protocol()),
	})

	found, err := c.Find(ctx, &pb.FindRequest{WorkspaceId: *ws})
	report("find-absent", err == nil && !found.GetFound(), errFields(err))

	_, err = c.RunImage(ctx, &pb.RunImageRequest{WorkspaceId: *ws, Image: *image, Labels: []string{"vz.test=go-host"}})
	report("run-image", err == nil, errFields(err))

	found, err = c.Find(ctx, &pb.FindRequest{WorkspaceId: *ws})
	report("find-running", err == nil && found.GetFound() && found.GetContainer().GetState().GetStatus() == "running" && found.GetContainer().GetId() != "", errFields(err))

	payload := []byte{0x00, 0xff, 0x80, '\n', '\r', 0x01}
	out, _, exit, _, err := execOnce(c, *ws, []string{"cat"}, payload)
	report("exec-binary-echo", err == nil && exit != nil && exit.ExitCode == 0 && exit.Signal == "" && bytes.Equal(out, payload),
		map[string]interface{}{"stdout_hex": hex.EncodeToString(out), "error": fmt.Sprint(err)})

	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	want := sha256.Sum256(big)
	out, _, exit, maxFrame, err := execOnce(c, *ws, []string{"cat"}, big)
	got := sha256.Sum256(out)
	report("exec-1mib", err == nil && exit != nil && exit.ExitCode == 0 && got == want && maxFrame <= 32768,
		map[string]interface{}{"bytes": len(out), "max_frame": maxFrame, "error": fmt.Sprint(err)})

	_, errOut, exit, _, err := execOnce(c, *ws, []string{"sh", "-c", "echo oops >&2; exit 3"}, nil)
	report("exec-exit-code", err == nil && exit != nil && exit.ExitCode == 3 && strings.Contains(string(errOut), "oops"), errFields(err))

	_, err = c.Stop(ctx, &pb.StopRequest{WorkspaceId: *ws})
	found, _ = c.Find(ctx, &pb.FindRequest{WorkspaceId: *ws})
	report("stop", err == nil && found.GetContainer().GetState().GetStatus() == "stopped", errFields(err))
	_, err = c.Start(ctx, &pb.StartRequest{WorkspaceId: *ws})
	found, _ = c.Find(ctx, &pb.FindRequest{WorkspaceId: *ws})
	report("start", err == nil && found.GetContainer().GetState().GetStatus() == "running", errFields(err))
	_, err = c.Delete(ctx, &pb.DeleteRequest{WorkspaceId: *ws})
	found, _ = c.Find(ctx, &pb.FindRequest{WorkspaceId: *ws})
	report("delete", err == nil && !found.GetFound(), errFields(err))

	_, err = c.Start(ctx, &pb.StartRequest{WorkspaceId: *ws + "-missing"})
	st, _ := status.FromError(err)
	details := 0
	var code string
	var message string
	if st != nil {
		for _, d := range st.Details() {
			if re, ok := d.(*pb.RuntimeError); ok {
				details++
				code = re.Code.String()
				message = re.Message
			}
		}
	}
	report("not-found-detail", err != nil && st.Code().String() == "NotFound" && details == 1 && code == "RUNTIME_ERROR_CODE_NOT_FOUND" && message != "",
		map[string]interface{}{"grpc_code": fmt.Sprint(st.Code()), "details": details, "code": code, "message": message})

	k0 := time.Now()
	client.Kill()
	report("shutdown", client.Exited(), map[string]interface{}{"ms": time.Since(k0).Milliseconds()})
	if failed {
		os.Exit(1)
	}
}

func errFields(err error) map[string]interface{} {
	if err == nil {
		return nil
	}
	return map[string]interface{}{"error": err.Error()}
}
