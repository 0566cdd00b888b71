import { createSocket, type RemoteInfo, type Socket } from "node:dgram";
import wrtc from "@roamhq/wrtc";
import type { RtcImplementation } from "../../src/sdk/webrtc.ts";

/**
 * A UDP relay between one device and the server: the network a test can cut. The device is told
 * (by rewriting the answer's candidates) that the server is at the relay; the relay forwards each
 * device address through its own socket to the server's candidate. `cut` drops packets in one
 * direction or both, as a device that vanished, or a network that lost its way back, would.
 */
export class UdpRelay {
  private readonly front: Socket;
  private readonly upstream = new Map<string, Socket>();
  private target: { address: string; port: number } | undefined;
  private dropToDevice = false;
  private dropToServer = false;
  /** Packets relayed to the server, and to the device. */
  readonly relayed = { toServer: 0, toDevice: 0 };

  /** The loopback address the relay sends to the server from: the device's address as the server sees it. */
  private readonly source: string;

  private constructor(front: Socket, source: string) {
    this.front = front;
    this.source = source;
    front.on("message", (msg, from) => this.fromDevice(msg, from));
  }

  /** `source`: another loopback address (127.0.0.2, …) gives the device an address of its own, apart from 127.0.0.1. */
  static async start(o: { source?: string } = {}): Promise<UdpRelay> {
    const front = createSocket("udp4");
    await new Promise<void>((resolve) => front.bind(0, "127.0.0.1", resolve));
    return new UdpRelay(front, o.source ?? "127.0.0.1");
  }

  get port(): number {
    return this.front.address().port;
  }

  /** Drops packets from now on: to the device, to the server, or both. */
  cut(direction: "to-device" | "to-server" | "both" = "both"): void {
    if (direction !== "to-server") this.dropToDevice = true;
    if (direction !== "to-device") this.dropToServer = true;
  }

  restore(): void {
    this.dropToDevice = false;
    this.dropToServer = false;
  }

  /** The answer with every candidate pointing at this relay (and the relay aimed at the server's first candidate). */
  rewriteAnswer(sdp: string): string {
    return sdp.replace(/^(a=candidate:\S+ \d+ udp \d+ )(\S+) (\d+)( typ \S+).*$/gim, (_line, head: string, address: string, port: string, typ: string) => {
      this.target ??= { address, port: Number(port) };
      return `${head}127.0.0.1 ${this.port}${typ}`;
    });
  }

  /** An RTCPeerConnection (wrtc) that reaches the server through this relay. */
  rtc(): RtcImplementation {
    const relay = this;
    const Base = wrtc.RTCPeerConnection as unknown as typeof RTCPeerConnection;
    class Relayed extends Base {
      constructor(config?: RTCConfiguration) {
        super(config);
        // The offer carries no candidates: the server learns the device's address only from its checks through the relay.
        // biome-ignore lint/correctness/noConstructorReturn: wrtc defines localDescription on each instance, unconfigurable
        return new Proxy(this, {
          get(target, name) {
            const value = Reflect.get(target, name, target);
            if (name === "localDescription" && value) {
              const d = value as unknown as RTCSessionDescription;
              return { type: d.type, sdp: d.sdp.replace(/^a=candidate:.*\r\n/gm, "") };
            }
            return typeof value === "function" ? value.bind(target) : value;
          },
          set(target, name, value) {
            return Reflect.set(target, name, value, target);
          },
        });
      }
      override setRemoteDescription(description: RTCSessionDescriptionInit): Promise<void> {
        return super.setRemoteDescription({ type: description.type, sdp: relay.rewriteAnswer(description.sdp ?? "") } as RTCSessionDescriptionInit);
      }
    }
    return { ...(wrtc as unknown as RtcImplementation), RTCPeerConnection: Relayed as unknown as typeof RTCPeerConnection };
  }

  private fromDevice(msg: Buffer, from: RemoteInfo): void {
    if (this.dropToServer || !this.target) return;
    const key = `${from.address}:${from.port}`;
    let up = this.upstream.get(key);
    if (!up) {
      const socket = createSocket("udp4");
      socket.on("message", (reply) => {
        if (this.dropToDevice) return;
        this.relayed.toDevice++;
        this.front.send(reply, from.port, from.address);
      });
      socket.on("error", () => {});
      socket.bind(0, this.source);
      this.upstream.set(key, socket);
      up = socket;
    }
    this.relayed.toServer++;
    up.send(msg, this.target.port, this.target.address);
  }

  close(): void {
    this.front.close();
    for (const s of this.upstream.values()) s.close();
    this.upstream.clear();
  }
}
