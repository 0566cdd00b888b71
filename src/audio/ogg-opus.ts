import { BufferTarget, EncodedAudioPacketSource, EncodedPacket, OggOutputFormat, Output } from "mediabunny";
import { OPUS_RATE } from "./opus.ts";

/** libopus's encoder look-ahead at 48 kHz: what a decoder drops from the start (RFC 7845 §4.2). */
const PRE_SKIP = 312;

/**
 * Mono Opus packets, in order, as an Ogg Opus file (RFC 7845), muxed by Mediabunny.
 * `samples[i]` is packet i's duration at 48 kHz; `inputRate` is the rate the audio was encoded
 * from (informational for players).
 */
export async function oggOpus(packets: readonly Uint8Array[], samples: readonly number[], inputRate: number): Promise<Uint8Array> {
  const target = new BufferTarget();
  const output = new Output({ format: new OggOutputFormat(), target });
  const source = new EncodedAudioPacketSource("opus");
  output.addAudioTrack(source);
  await output.start();
  const description = opusHead(inputRate);
  let at = 0;
  for (let i = 0; i < packets.length; i++) {
    const duration = samples[i]! / OPUS_RATE;
    const packet = new EncodedPacket(packets[i]!, "key", at / OPUS_RATE, duration);
    await source.add(packet, i === 0 ? { decoderConfig: { codec: "opus", numberOfChannels: 1, sampleRate: OPUS_RATE, description } } : undefined);
    at += samples[i]!;
  }
  await output.finalize();
  return new Uint8Array(target.buffer ?? new ArrayBuffer(0));
}

/** The identification header (RFC 7845 §5.1): version 1, one channel, mapping family 0. */
function opusHead(inputRate: number): Uint8Array {
  const head = Buffer.alloc(19);
  head.write("OpusHead", 0, "latin1");
  head[8] = 1;
  head[9] = 1;
  head.writeUInt16LE(PRE_SKIP, 10);
  head.writeUInt32LE(inputRate, 12);
  head.writeInt16LE(0, 16);
  head[18] = 0;
  return head;
}
