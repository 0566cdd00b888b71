import { readFileSync, statSync } from "node:fs";
import { createSecureContext } from "node:tls";
import { ConfigError } from "../config/config.ts";

export interface TlsFiles {
  cert: Buffer;
  key: Buffer;
}

/** Far above any certificate chain or key; a larger file is not one. */
const MAX_PEM_BYTES = 1 << 20;

function read(path: string, setting: string): Buffer {
  try {
    // Checked before reading: a FIFO would hold the start-up for ever, /dev/zero fill the memory.
    const stat = statSync(path);
    if (!stat.isFile()) throw new ConfigError(`${setting} ${path} is not a regular file`);
    if (stat.size > MAX_PEM_BYTES) throw new ConfigError(`${setting} ${path} is over 1 MiB: not a PEM certificate or key`);
    return readFileSync(path);
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError(`${setting} ${path} cannot be read: ${(err as Error).message}`);
  }
}

/**
 * The certificate and key of `tls`, read once at start-up and tried together, so that a file that
 * cannot be read, is not PEM, or a key that does not belong to the certificate stops the server with
 * the path named, instead of failing every handshake later.
 */
export function readTlsFiles(tls: { cert_file: string; key_file: string }): TlsFiles {
  const cert = read(tls.cert_file, "tls.cert_file");
  const key = read(tls.key_file, "tls.key_file");
  try {
    createSecureContext({ cert, key });
  } catch (err) {
    const e = err as Error & { code?: string };
    const why =
      e.code === "ERR_OSSL_X509_KEY_VALUES_MISMATCH" || /key values mismatch/i.test(e.message)
        ? `the key in tls.key_file ${tls.key_file} does not match the certificate in tls.cert_file ${tls.cert_file}`
        : `tls.cert_file ${tls.cert_file} and tls.key_file ${tls.key_file} are not a usable PEM certificate and key`;
    throw new ConfigError(`${why} (${e.message})`);
  }
  return { cert, key };
}
