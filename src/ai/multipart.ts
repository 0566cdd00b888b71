/** Text fields and one file as multipart/form-data, with its boundary. */
export function multipart(fields: Array<[string, string]>, file: { name: string; type: string; bytes: Uint8Array }): { body: Buffer; contentType: string } {
  const boundary = `----perch${crypto.randomUUID().replaceAll("-", "")}`;
  const quote = (s: string) => s.replace(/["\r\n]/g, (ch) => encodeURIComponent(ch));
  const parts: Buffer[] = fields.map(([key, value]) =>
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${quote(key)}"\r\n\r\n${value}\r\n`),
  );
  parts.push(
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${quote(file.name)}"\r\nContent-Type: ${file.type}\r\n\r\n`),
    Buffer.from(file.bytes.buffer, file.bytes.byteOffset, file.bytes.byteLength),
    Buffer.from(`\r\n--${boundary}--\r\n`),
  );
  return { body: Buffer.concat(parts), contentType: `multipart/form-data; boundary=${boundary}` };
}
