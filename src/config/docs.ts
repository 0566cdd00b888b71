import { SETTINGS, type Setting } from "./settings.ts";

/** docs/configuration.md: written by `npm run -s docs:config` from the schema; a test fails when the file is stale. */
export const CONFIGURATION_DOC = "docs/configuration.md";

const INTRO = `# Configuration

<!-- Generated from src/config/schema.ts by \`npm run -s docs:config\`: edit the schema, then run it. -->

Every setting can come from a YAML or JSON file named by \`PERCH_CONFIG\`; when that variable is
unset, \`./perch.yaml\` (or \`./perch.yml\`, \`./perch.json\`) in the working directory is read, by
the server and by every \`perch\` command (\`PERCH_CONFIG=\` set empty reads none). Environment
variables override the file, and a command's \`--server\` overrides both. File keys are snake_case at every level. Every setting outside a list also has
an environment variable, its key in capitals with \`PERCH_\` before it and \`_\` for each dot
(\`webrtc.udp_port\` is \`PERCH_WEBRTC_UDP_PORT\`); a few settings also answer to the shorter name
they had before the names were derived (shown in brackets; the derived name wins when both are
set). A variable takes \`true\`/\`false\`, a number, or a comma-separated list where the setting is
a list. Lists of objects (\`providers\`, \`models\`, \`agents\`, \`mcp_servers\`, \`api_keys\`,
\`ice.servers\`) are set in the file only.

The camelCase keys of earlier releases (\`dataDir\`, \`rateLimits\`) are still read in this release,
each named in a warning at start-up; the next release refuses them. A key the schema does not know
is refused at start-up, naming the nearest valid key (\`did you mean store_transcripts?\`).

Example \`perch.yaml\`:

\`\`\`yaml
port: 8443
public_endpoint: perch.example.com:8443
database_url: postgres://perch@db.internal/perch
registration: { policy: token, tokens: [first-batch-2026] }
ice:
  servers:
    - { urls: ["turn:turn.example.com:3478"], secret: change-me, name: perch }
\`\`\`
`;

const cell = (text: string) => text.replace(/\|/g, "\\|").replace(/\n/g, " ");

function defaultOf(s: Setting): string {
  if (s.defaultText) return s.defaultText;
  if (s.default === undefined) return "none";
  if (Array.isArray(s.default) && s.default.length === 0) return "none";
  if (Array.isArray(s.default)) return `\`[${s.default.join(", ")}]\``;
  if (typeof s.default === "object") return "`{}`";
  return `\`${s.default === "" ? '""' : String(s.default)}\``;
}

function row(s: Setting): string {
  const variable = s.env ? [`\`${s.env}\``, ...s.aliases.map((a) => `(\`${a}\`)`)].join(" ") : "—";
  const values = s.enum && !s.description?.includes(`\`${String(s.enum[0])}\``) ? `; one of ${s.enum.map((v) => `\`${v}\``).join(", ")}` : "";
  return `| \`${s.key}\` | ${variable} | ${cell(defaultOf(s))} | ${cell(`${s.description ?? ""}${values}`)} |`;
}

const HEADER = "| file key | variable | default | meaning |\n| --- | --- | --- | --- |";

/** The whole of docs/configuration.md. */
export function configurationMarkdown(): string {
  const parts = [INTRO, "## Top level\n", HEADER];
  const top = SETTINGS.filter((s) => s.depth === 1);
  for (const s of top.filter((t) => t.kind === "value")) parts.push(row(s));
  for (const section of top.filter((t) => t.kind !== "value")) {
    const within = SETTINGS.filter((s) => s.key.startsWith(`${section.key}.`) || s.key.startsWith(`${section.key}[].`));
    const what = section.kind === "list" ? `a list; each entry takes the keys below` : "";
    const about = [section.description, what].filter(Boolean).join(": ");
    parts.push(`\n## \`${section.key}\`\n`, `${about.charAt(0).toUpperCase()}${about.slice(1)}.\n`, HEADER);
    for (const s of within.filter((w) => w.kind !== "section")) parts.push(row(s));
  }
  return `${parts.join("\n")}\n`;
}

/** Settings the documentation would show without a meaning: each needs `.meta({ description })` in the schema. */
export function undescribed(): string[] {
  return SETTINGS.filter((s) => !s.description).map((s) => s.key);
}
