package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
)

// runUpdateMachine calls UpdateMachine as the Machine controller does for the Machine the
// bed stored (see -print-machine): until retryAfterSeconds is 0 when `untilDone`, once
// otherwise, waiting retryAfterSeconds (at most `poll`) between calls.
func runUpdateMachine(ctx context.Context, c *runtimeClient, t target, untilDone bool, poll time.Duration) error {
	desired := t.workerSide(toVersion, 8192, t.kubeadmConfig())
	desired.machine = inPlaceMarked(desired.machine)
	for call := 1; ; call++ {
		name := "update-machine"
		if call > 1 {
			name = "" // only the first exchange is recorded: later ones depend on timing
		}
		resp := &runtimehooksv1.UpdateMachineResponse{}
		if err := c.call(ctx, name, runtimehooksv1.UpdateMachine, updateMachineRequest(desired), resp); err != nil {
			return fmt.Errorf("UpdateMachine call %d: %w", call, err)
		}
		if resp.RetryAfterSeconds == 0 {
			fmt.Printf("ok   update-machine: done after %d calls (%s)\n", call, resp.Message)
			return callAgainWhenDone(ctx, c, desired)
		}
		if resp.RetryAfterSeconds < 0 {
			return fmt.Errorf("UpdateMachine call %d: retryAfterSeconds %d", call, resp.RetryAfterSeconds)
		}
		fmt.Printf("...  update-machine call %d: retry after %ds (%s)\n", call, resp.RetryAfterSeconds, resp.Message)
		if !untilDone {
			return nil
		}
		wait := min(time.Duration(resp.RetryAfterSeconds)*time.Second, poll)
		select {
		case <-ctx.Done():
			return fmt.Errorf("UpdateMachine not done after %d calls: %w", call, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// callAgainWhenDone calls UpdateMachine once more: Cluster API may (a requeue before it
// records completion), and the answer must still be done.
func callAgainWhenDone(ctx context.Context, c *runtimeClient, desired machineObjects) error {
	resp := &runtimehooksv1.UpdateMachineResponse{}
	if err := c.call(ctx, "", runtimehooksv1.UpdateMachine, updateMachineRequest(desired), resp); err != nil {
		return fmt.Errorf("UpdateMachine after done: %w", err)
	}
	if resp.RetryAfterSeconds != 0 {
		return fmt.Errorf("UpdateMachine after done: retry after %ds (%s)", resp.RetryAfterSeconds, resp.Message)
	}
	fmt.Printf("ok   update-machine: still done when called again (%s)\n", resp.Message)
	return nil
}

// runForgedUpdateMachine asks to update a Machine the management cluster does not hold:
// the extension must answer Failure (Cluster API then reports the failure on the Machine).
func runForgedUpdateMachine(ctx context.Context, c *runtimeClient, t target) error {
	desired := t.workerSide(toVersion, 8192, t.kubeadmConfig())
	desired.machine = inPlaceMarked(desired.machine)
	desired.machine.Name = "not-a-stored-machine"
	resp := &runtimehooksv1.UpdateMachineResponse{}
	err := c.call(ctx, "update-machine-unknown-machine", runtimehooksv1.UpdateMachine, updateMachineRequest(desired), resp)
	if err == nil {
		return errors.New("update-machine-unknown-machine: answered Success for a Machine the management cluster does not hold")
	}
	if resp.Status != runtimehooksv1.ResponseStatusFailure {
		return fmt.Errorf("update-machine-unknown-machine: %w", err)
	}
	fmt.Printf("ok   update-machine-unknown-machine: Failure (%s)\n", resp.Message)
	return nil
}
