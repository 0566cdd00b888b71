#!/usr/bin/env bash
# Installs the speech recogniser behind the Compatible API's whisper-1 (PocketSphinx and its
# US English model, from Debian or Ubuntu). Speech synthesis (flite) and ffmpeg come with
# `npm install` and need nothing here.
#
# Usage: npm run setup:speech           install when missing (uses sudo when not root)
#        npm run setup:speech -- --print print the command instead of running it
set -euo pipefail

readonly MODEL=/usr/share/pocketsphinx/model/en-us/en-us/mdef
readonly PACKAGES=(pocketsphinx pocketsphinx-en-us)

if command -v pocketsphinx_continuous >/dev/null 2>&1 && [[ -f "$MODEL" ]]; then
  echo "PocketSphinx and its en-us model are installed: transcription (whisper-1) is available."
  exit 0
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then sudo=(sudo); fi
command=("${sudo[@]}" apt-get install -y --no-install-recommends "${PACKAGES[@]}")

if [[ "${1:-}" == "--print" ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "Install PocketSphinx with:"
  echo "  ${sudo[*]:+${sudo[*]} }apt-get update && ${command[*]}"
  command -v apt-get >/dev/null 2>&1 || echo "(no apt-get here: install your system's pocketsphinx and its en-us model)"
  exit 0
fi

echo "+ ${sudo[*]:+${sudo[*]} }apt-get update" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
echo "+ ${command[*]}" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}"
