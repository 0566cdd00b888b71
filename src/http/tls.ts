import { readFileSync } from "node:fs";
import { createSecureContext } from "node:tls";
import { ConfigError } from "../config/config.ts";

export interface TlsFiles {
  cert: Buffer;
  key: Buffer;
}

function read(path: string, setting: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
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
