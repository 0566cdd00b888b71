import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { PeerService } from "../domain/peers.ts";
import {
  ClientGetIdentifiersResponseSchema,
  ClientGetInfoResponseSchema,
  DeviceInfoSchema,
  RpcMethod,
  ServerPutInfoRequestSchema,
  ServerPutInfoResponseSchema,
} from "../protocol/gen/rpc_pb.ts";
import type { DeviceInfo } from "../protocol/public.ts";
import { commonHandlers, decodeParams, RpcCode, RpcError, type RpcHandlers } from "../protocol/rpc.ts";
import { isStorableText } from "../protocol/text.ts";

const MAX_NAME_BYTES = 256;
const MAX_EMOJI_BYTES = 64;
const MAX_TEXT_BYTES = 256;
const MAX_LIST = 64;

/**
 * What the server provides on stream 0 of one connection: `all.*` and `server.info.put`. A speed
 * test runs one at a time per connection (another one meanwhile is 409): on 256 streams at once
 * the 64 MiB cap would otherwise be 16 GiB of the node's bandwidth and encryption.
 */
export function rpcHandlers(publicKey: string, peers: Pick<PeerService, "mergeDeviceInfo">): RpcHandlers {
  const common = commonHandlers();
  const speedTest = common[RpcMethod.ALL_SPEED_TEST_RUN]!;
  let speedTestRunning = false;
  return {
    ...common,
    [RpcMethod.ALL_SPEED_TEST_RUN]: async (payload, ctx) => {
      if (speedTestRunning) throw new RpcError(RpcCode.CONFLICT, "a speed test is already running on this connection");
      speedTestRunning = true;
      try {
        const reply = await speedTest(payload, ctx);
        return { ...reply, sent: () => (speedTestRunning = false) };
      } catch (err) {
        speedTestRunning = false;
        throw err;
      }
    },
    [RpcMethod.SERVER_INFO_PUT]: async (payload) => {
      const profile = decodeParams(ServerPutInfoRequestSchema, payload).value;
      const patch: DeviceInfo = {};
      if (profile?.name !== undefined) patch.name = checkText("name", profile.name, MAX_NAME_BYTES);
      if (profile?.emoji !== undefined) patch.emoji = checkText("emoji", profile.emoji, MAX_EMOJI_BYTES);
      const info = await peers.mergeDeviceInfo(publicKey, patch);
      return { payload: toBinary(ServerPutInfoResponseSchema, create(ServerPutInfoResponseSchema, { value: toProto(info) })) };
    },
  };
}

function checkText(field: string, value: string, maxBytes: number): string {
  if (Buffer.byteLength(value) > maxBytes) throw new RpcError(RpcCode.INVALID_PARAMS, `${field} is over ${maxBytes} bytes`);
  if (!isStorableText(value)) throw new RpcError(RpcCode.INVALID_PARAMS, `${field} holds characters that cannot be stored`);
  return value;
}

/** A device's text, or undefined when it is not fit to store (then the whole answer is ignored). */
function text(value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  if (Buffer.byteLength(value) > MAX_TEXT_BYTES || !isStorableText(value)) throw new Error("unfit text");
  return value;
}

function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** `client.info.get`'s answer as a DeviceInfo patch; undefined when it carries nothing usable. */
export function deviceInfoFromHardware(payload: Uint8Array): DeviceInfo | undefined {
  try {
    const hw = fromBinary(ClientGetInfoResponseSchema, payload).value;
    if (!hw) return undefined;
    return { hardware: defined({ hardware_revision: text(hw.hardwareRevision), manufacturer: text(hw.manufacturer), model: text(hw.model) }) };
  } catch {
    return undefined;
  }
}

/** `client.identifiers.get`'s answer as a DeviceInfo patch. */
export function deviceInfoFromIdentifiers(payload: Uint8Array): DeviceInfo | undefined {
  try {
    const ids = fromBinary(ClientGetIdentifiersResponseSchema, payload).value;
    if (!ids || ids.imeis.length > MAX_LIST || ids.labels.length > MAX_LIST) return undefined;
    return {
      identifiers: defined({
        sn: text(ids.sn),
        imeis: ids.imeis.map((i) => defined({ name: text(i.name), tac: text(i.tac) as string, serial: text(i.serial) as string })),
        labels: ids.labels.map((l) => ({ key: text(l.key) as string, value: text(l.value) as string })),
      }),
    };
  } catch {
    return undefined;
  }
}

function toProto(info: DeviceInfo) {
  return create(DeviceInfoSchema, {
    ...(info.name !== undefined ? { name: info.name } : {}),
    ...(info.emoji !== undefined ? { emoji: info.emoji } : {}),
    ...(info.hardware
      ? { hardware: { hardwareRevision: info.hardware.hardware_revision, manufacturer: info.hardware.manufacturer, model: info.hardware.model } }
      : {}),
    ...(info.identifiers
      ? {
          identifiers: {
            sn: info.identifiers.sn,
            imeis: (info.identifiers.imeis ?? []).map((i) => ({ name: i.name, tac: i.tac, serial: i.serial })),
            labels: info.identifiers.labels ?? [],
          },
        }
      : {}),
  });
}
