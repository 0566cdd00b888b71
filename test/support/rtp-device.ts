import nodeDataChannel, { type DataChannel, type PeerConnection, type Track } from "node-datachannel";
import { encodeKey, generateKeyPair } from "../../src/crypto/keys.ts";
import { PACKET_LABEL, SERVICE, SERVICE_PREFIX } from "../../src/protocol/channel.ts";
import type { TestServer } from "./server.ts";
import { eventually, postOffer, sealOffer } from "./webrtc.ts";

export const OPUS_PT = 111;

/**
 * A device on node-datachannel whose audio track sends the RTP packets a test writes, byte for
 * byte (a hostile or broken sender), with the packet channel and event stream a device opens.
 */
export class RtpDevice {
  readonly publicKey: string;
  private readonly pc: PeerConnection;
  private readonly track: Track;
  private readonly channels: DataChannel[];

  private constructor(pc: PeerConnection, track: Track, channels: DataChannel[], publicKey: string) {
    this.pc = pc;
    this.track = track;
    this.channels = channels;
    this.publicKey = publicKey;
  }

  static async connect(server: TestServer): Promise<RtpDevice> {
    const keyPair = generateKeyPair();
    const serverKey = ((await (await fetch(`${server.url}/server-info`)).json()) as { public_key: string }).public_key;
    const pc = new nodeDataChannel.PeerConnection(`rtp-device-${Math.random()}`, { iceServers: [] });
    try {
      const audio = new nodeDataChannel.Audio("0", "SendRecv");
      audio.addOpusCodec(OPUS_PT);
      audio.addSSRC(0x1234, "device", "device", "device-audio");
      const track = pc.addTrack(audio);
      const packets = pc.createDataChannel(PACKET_LABEL, { unordered: true, maxRetransmits: 0 });
      const events = pc.createDataChannel(`${SERVICE_PREFIX}${SERVICE.EVENTS}`);
      await eventually(() => pc.gatheringState() === "complete", 10_000, "ICE gathering");
      const sdp = pc.localDescription()!.sdp;
      const sealed = sealOffer(serverKey, keyPair, sdp);
      const res = await postOffer(server.url, sealed.headers, sealed.body);
      const body = new Uint8Array(await res.arrayBuffer());
      if (res.status !== 200) throw new Error(`offer refused: ${res.status} ${Buffer.from(body).toString()}`);
      pc.setRemoteDescription(sealed.exchange.openResponse(body), "answer");
      await eventually(() => track.isOpen() && events.isOpen() && packets.isOpen(), 10_000, "the track and channels open");
      return new RtpDevice(pc, track, [packets, events], encodeKey(keyPair.publicKey));
    } catch (err) {
      pc.close();
      throw err;
    }
  }

  /** Sends one packet on the audio track as it is (SRTP-protected by the stack). */
  send(packet: Buffer): boolean {
    try {
      return this.track.isOpen() && this.track.sendMessageBinary(packet);
    } catch {
      return false;
    }
  }

  close(): void {
    for (const dc of this.channels) {
      try {
        dc.close();
      } catch {}
    }
    try {
      this.track.close();
    } catch {}
    this.pc.close();
  }
}

/** An RTP packet (RFC 3550) of the given fields around `payload`. */
export function rtpPacket(o: { sequence: number; timestamp: number; ssrc?: number; payloadType?: number; marker?: boolean }, payload: Buffer): Buffer {
  const header = Buffer.alloc(12);
  header[0] = 0x80;
  header[1] = (o.marker ? 0x80 : 0) | ((o.payloadType ?? OPUS_PT) & 0x7f);
  header.writeUInt16BE(o.sequence & 0xffff, 2);
  header.writeUInt32BE(o.timestamp >>> 0, 4);
  header.writeUInt32BE((o.ssrc ?? 0x1234) >>> 0, 8);
  return Buffer.concat([header, payload]);
}
