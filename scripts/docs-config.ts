/** Writes docs/configuration.md from the configuration schema (`npm run -s docs:config`). */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { CONFIGURATION_DOC, configurationMarkdown, undescribed } from "../src/config/docs.ts";

const missing = undescribed();
if (missing.length > 0) {
  console.error(`settings without a description (add .meta({ description }) in src/config/schema.ts): ${missing.join(", ")}`);
  process.exitCode = 1;
}
writeFileSync(join(import.meta.dirname, "..", CONFIGURATION_DOC), configurationMarkdown());
console.log(`wrote ${CONFIGURATION_DOC}`);
