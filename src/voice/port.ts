import type { VoiceEvent } from "./peer-events.ts";

/**
 * What the voice feature needs from a device's connection, and nothing more: the transport
 * implements it (src/transport/connection.ts), so the voice code never sees WebRTC.
 */
export interface AudioPort {
  /** The device's public key (base58). */
  readonly publicKey: string;
  /** The RTP payload type the device offered for Opus (its uplink uses it; the downlink too). */
  readonly payloadType: number;
  /** The header extension id of the audio level (RFC 6464), when the device offered it (and the answer accepted it). */
  readonly audioLevelId?: number | undefined;
  /**
   * Subscribes to each packet received on the audio track (RTP, or RTCP sharing the track), in
   * the order subscribed; returns the unsubscribe. A listener that throws ends the conversation.
   */
  onPacket(cb: (packet: Buffer) => void): () => void;
  /** Sends one Opus frame (20 ms) on the track's sender, continuing its RTP sequence and timestamps; false when not sent. */
  sendFrame(opus: Buffer, first: boolean): boolean;
  /**
   * Sends one voice event on the event stream (service 32): the transport gives it the
   * connection's next sequence number (from 1) and the server's time, and encodes it
   * (`encodeVoiceEvent`); false when the stream is gone.
   */
  sendEvent(event: VoiceEvent): boolean;
}

/** One conversation's end, as the transport sees it. */
export interface VoiceSession {
  close(): void;
  /** Whether the user is heard speaking now (before a turn begins too): a drain does not hand the device over then. */
  hearing?(): boolean;
}

/** The voice feature, as the transport sees it: a session per active connection. */
export interface VoiceHost {
  open(port: AudioPort): VoiceSession;
}
