import { RpcMethod } from "../protocol/gen/rpc_pb.ts";
import { RpcError, rpcPayload } from "../protocol/rpc.ts";

/** What liveness needs of a connection. */
export interface Watched {
  readonly publicKey: string;
  readonly active: boolean;
  /** `performance.now()` of the last thing received from the device (a message, RTP or RTCP). */
  lastHeard(): number;
  /** Calls `all.ping` on the device. */
  call(method: RpcMethod, payload: Uint8Array, o: { timeoutMs: number }): Promise<unknown>;
  close(reason: "unresponsive"): Promise<void>;
}

export interface LivenessOptions {
  /** A device quiet this long is asked `all.ping`. */
  quietMs: number;
  /** A device that has not answered the ping by then is taken as gone; its connection is closed. */
  probeTimeoutMs: number;
  /** How often quiet devices are looked for. */
  checkEveryMs: number;
}

/**
 * Notices devices that vanished without closing (power lost, out of range): the ICE library's
 * consent check would take 18–30 s. Anything the device sends counts as a sign of life (its
 * telemetry, RTP, the RTCP reports libwebrtc sends every few seconds); a device quiet for
 * `quietMs` is asked `all.ping` (every device answers it: transport contract, section 5), and one
 * that does not answer within `probeTimeoutMs` — not even with an error — is closed. A vanished
 * device is therefore offline within quietMs + checkEveryMs + probeTimeoutMs.
 */
export class Liveness {
  private readonly o: LivenessOptions;
  private readonly connections: () => Iterable<Watched>;
  private readonly probing = new WeakSet<Watched>();
  private readonly timer: NodeJS.Timeout;
  private readonly onError: (err: unknown) => void;

  constructor(o: LivenessOptions, connections: () => Iterable<Watched>, onError: (err: unknown) => void) {
    this.o = o;
    this.connections = connections;
    this.onError = onError;
    this.timer = setInterval(() => this.check(), o.checkEveryMs);
    this.timer.unref();
  }

  private check(): void {
    try {
      const now = performance.now();
      for (const c of this.connections()) {
        if (!c.active || this.probing.has(c) || now - c.lastHeard() < this.o.quietMs) continue;
        this.probe(c);
      }
    } catch (err) {
      this.onError(err);
    }
  }

  private probe(c: Watched): void {
    this.probing.add(c);
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("no answer to all.ping")), this.o.probeTimeoutMs);
    });
    Promise.race([c.call(RpcMethod.ALL_PING, rpcPayload.ping(), { timeoutMs: this.o.probeTimeoutMs }), deadline])
      .finally(() => clearTimeout(timer))
      .then(
        () => this.probing.delete(c),
        (err) => {
          this.probing.delete(c);
          // An error answer is an answer: the device is there.
          if (err instanceof RpcError || !c.active) return;
          void c.close("unresponsive");
        },
      );
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
