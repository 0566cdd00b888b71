/** A form as multipart/form-data bytes, encoded by Node's own `FormData` (its boundary in the content type). */
export async function encodeForm(form: FormData): Promise<{ body: Buffer; contentType: string }> {
  const encoded = new Response(form);
  return { body: Buffer.from(await encoded.arrayBuffer()), contentType: encoded.headers.get("content-type")! };
}

/** Text fields and one file as multipart/form-data. */
export function multipart(
  fields: Array<[string, string]>,
  file: { name: string; type: string; bytes: Uint8Array },
): Promise<{ body: Buffer; contentType: string }> {
  const form = new FormData();
  for (const [key, value] of fields) form.append(key, value);
  form.append("file", new File([file.bytes as Uint8Array<ArrayBuffer>], file.name, { type: file.type }));
  return encodeForm(form);
}
