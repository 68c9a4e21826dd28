#!/usr/bin/env bash
# Dev tool (not part of the product): build .carry/, everything `scripts/device-e2e.sh` needs on the GPU
# machine that its image lacks, small enough to travel with the working tree (the device tool carries at
# most 64 MiB in all, repository included):
#
#   .carry/jre.tar.xz            a Java 17 runtime cut down with jlink to the modules the broker uses
#   .carry/kafka-4.4.0.tar.xz    the Apache Kafka broker jars (devtools/kafka_jars.py's folder, trimmed:
#                                native libraries for other platforms removed, every jar re-stored
#                                uncompressed so that xz compresses the whole set at once)
#   .carry/whl/*.whl             cp312 / py3 wheels of the Python packages the run imports and the image lacks
#   .carry/toolchain/*.whl       nvidia-cutlass (CUTLASS/CuTe C++ headers) and ninja, for device-engine.sh cuda_ext
#   .carry/SIZES.txt             what was built and how big it is
#
# Usage: scripts/device-carry.sh            (needs java 17 with jmods, jlink, unzip, zip, xz, the venv's pip)
#        scripts/device-carry.sh --check    (then unpack what was built and run bench.e2e with the stub
#                                            engine through it: broker from the carried JRE and jars, the
#                                            service, producer, tail and lag sampler; it reports broker log
#                                            lines naming a missing class)
# Re-running rebuilds .carry/ from scratch. Nothing is written outside .carry/ and a temporary folder.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
check=0
[[ "${1:-}" == "--check" ]] && check=1

# JDK whose jmods jlink reads: the one `javac`/`java` on PATH belongs to (Java 17, which the broker supports)
jdk="${CARRY_JDK:-$(dirname "$(dirname "$(readlink -f "$(command -v jlink)")")")}"
[[ -d "$jdk/jmods" ]] || { echo "device-carry: no jmods under $jdk (install openjdk-17-jmods)" >&2; exit 1; }
python="${CARRY_PYTHON:-python3}"

# Modules of the broker's jars (jdeps over the jar folder) that a single-node PLAINTEXT broker loads.
# java.desktop stays: the storage format step fails without java.beans (NoClassDefFoundError:
# java/beans/PropertyChangeEvent). java.rmi, java.scripting and java.compiler (log4j-core's optional JMX
# remote, script and compiler bits) are left out; `--check` runs the broker and the service through them.
modules="java.base,java.desktop,java.logging,java.management,java.naming,java.security.jgss"
modules+=",java.security.sasl,java.sql,java.xml,jdk.unsupported,jdk.management,jdk.crypto.ec"
# Wheels: what the service path imports (consumer.pipeline.pipeline, devtools.kafka_local, engine.runner, bench.*)
# and the device image does not have (.library/device/KINDS.md, "Python packages already there"), at the
# versions of the project venv (aiokafka 0.14 imports async_timeout on every Python; fastapi, starlette,
# uvicorn, annotated-doc, backports.zstd, opentelemetry-api (fastapi needs it), anyio and swagger-ui-bundle-v2
# (/docs) serve HTTP for bench.startup and bench.e2e --mixed); httpx, httpcore, h11, certifi and idna are
# bench.e2e --mixed's HTTP client (the image has them too, at versions of its own; these match the venv's;
# httpx 0.28+ needs no sniffio); typing_extensions rides along because pydantic-core needs a recent one.
# PyAV (35.8 MB) does not fit: bench.e2e puts a placeholder in its place (its events carry no media).
wheels=(aiokafka async-timeout pydantic pydantic_core pydantic-settings python-dotenv typing-inspection annotated-types
        structlog tenacity typing_extensions fastapi starlette uvicorn annotated-doc backports.zstd
        opentelemetry-api anyio swagger-ui-bundle-v2 httpx httpcore h11 certifi idna)

# CUTLASS 4.2's headers (6.4 MB wheel) and ninja, for torch extensions built on the GPU machine
toolchain_cutlass=4.2.0.0
toolchain_ninja=1.13.2

carry="$repo/.carry"
work="$(mktemp -d /tmp/clef-carry.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rm -rf "$carry"
mkdir -p "$carry/whl"

# ---- JRE ------------------------------------------------------------------------------------------------
# jlink --compress=2 zips each class in the modules image, which leaves xz little to find (29.6 MB as a
# tar.xz); an uncompressed image compresses to about 15 MB instead. libjvm.so comes unstripped from Debian.
echo "device-carry: jlink ($modules)" >&2
"$jdk/bin/jlink" --module-path "$jdk/jmods" --add-modules "$modules" \
    --strip-debug --no-header-files --no-man-pages --compress=0 --output "$work/jre" >/dev/null
strip --strip-unneeded "$work/jre/lib/server/libjvm.so" "$work"/jre/lib/*.so 2>/dev/null || true
"$work/jre/bin/java" -version 2>&1 | head -1 >&2
tar -C "$work" -cf - jre | xz -9e -T2 >"$carry/jre.tar.xz"

# ---- broker jars ----------------------------------------------------------------------------------------
jars="$("$python" -m devtools.kafka_jars)"  # fetches them first when the cache has none
name="$(basename "$jars")"
mkdir -p "$work/kafka/$name"
echo "device-carry: repacking $(ls "$jars"/*.jar | wc -l) jars from $jars" >&2
for jar in "$jars"/*.jar; do
    base="$(basename "$jar")"
    x="$work/x/$base"
    mkdir -p "$x"
    unzip -q "$jar" -d "$x"
    case "$base" in  # keep the linux x86-64 library of the three compression codecs, drop the others
        zstd-jni-*) find "$x" -maxdepth 1 -mindepth 1 -type d \
                        \( -name aix -o -name darwin -o -name freebsd -o -name win \) -exec rm -rf {} +
                    find "$x/linux" -mindepth 1 -maxdepth 1 -type d ! -name amd64 -exec rm -rf {} + ;;
        snappy-java-*) find "$x/org/xerial/snappy/native" -mindepth 1 -maxdepth 1 -type d ! -name Linux \
                           -exec rm -rf {} +
                       find "$x/org/xerial/snappy/native/Linux" -mindepth 1 -maxdepth 1 -type d \
                           ! -name x86_64 -exec rm -rf {} + ;;
        lz4-java-*) find "$x/net/jpountz/util" -mindepth 1 -maxdepth 1 -type d ! -name linux -exec rm -rf {} +
                    find "$x/net/jpountz/util/linux" -mindepth 1 -maxdepth 1 -type d ! -name amd64 \
                        -exec rm -rf {} + ;;
    esac
    (cd "$x" && zip -q -0 -X -r "$work/kafka/$name/$base" .)
    rm -rf "$x"
done
cp "$jars/COMPLETE" "$work/kafka/$name/"
tar -C "$work/kafka" -cf - "$name" | xz -9e -T2 >"$carry/$name.tar.xz"

# ---- wheels ---------------------------------------------------------------------------------------------
specs=()
for w in "${wheels[@]}"; do
    v="$("$python" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$w")"
    specs+=("$w==$v")
done
echo "device-carry: wheels ${specs[*]}" >&2
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$carry/whl" "${specs[@]}"
for f in "$carry"/whl/*.whl; do  # one interpreter on the device: CPython 3.12, x86-64
    case "$(basename "$f")" in
        *-cp312-cp312-*x86_64*.whl | *-py3-none-any.whl | *-py2.py3-none-any.whl) ;;
        *) echo "device-carry: wheel of the wrong kind: $f" >&2; exit 1 ;;
    esac
done

# ---- toolchain: CUTLASS's C++ headers and ninja, for `device-engine.sh cuda_ext` (the GPU machine has nvcc) --
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$carry/toolchain" "nvidia-cutlass==$toolchain_cutlass" "ninja==$toolchain_ninja"

# ---- sizes ----------------------------------------------------------------------------------------------
{
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD)"
    echo "jre modules: $modules"
    echo "jre unpacked: $(du -sh "$work/jre" | cut -f1)   jars unpacked: $(du -sh "$work/kafka" | cut -f1)"
    echo "jars: $(cd "$work/kafka/$name" && ls ./*.jar | sed 's|^\./||' | tr '\n' ' ')"
    (cd "$carry" && ls -l jre.tar.xz "$name.tar.xz" whl/*.whl toolchain/*.whl | awk '{printf "%10d  %s\n", $5, $9}')
    echo "carry total (du -sb): $(du -sb "$carry" | cut -f1) bytes, $(du -sh "$carry" | cut -f1)"
    tracked="$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
    echo "repository working tree (tracked files): $tracked bytes"
    echo "together: $(( ($(du -sb "$carry" | cut -f1) + tracked) / 1048576 )) MiB (the device takes 64 MiB)"
} | tee "$carry/SIZES.txt"

if [[ $check == 1 ]]; then
    # the broker from exactly what travels: unpack into a temporary cache and JRE, produce and consume
    mkdir -p "$work/try/cache"
    tar -C "$work/try" -xJf "$carry/jre.tar.xz"
    tar -C "$work/try/cache" -xJf "$carry/$name.tar.xz"
    PATH="$work/try/jre/bin:$PATH" CLEF_CACHE_DIR="$work/try/cache" "$python" -m bench.e2e --engine stub \
        --rate 20 --seconds 4 --warmup-s 2 --pool 32 --out "$work/try/out"
fi
