# Homebrew formula for deadletter, built from a local checkout (deadletter is not published
# anywhere brew could download it from). From the checkout:
#
#   HOMEBREW_DEADLETTER_SOURCE="$PWD" brew install --build-from-source ./packaging/homebrew/deadletter.rb
#   brew services start deadletter
#
# brew clones the checkout's committed HEAD, builds the release binary with cargo, writes the
# default config to $(brew --prefix)/etc/deadletter/deadletter.toml (once, never over yours),
# and `brew services` runs it with its data in $(brew --prefix)/var/deadletter.
# (No homepage: the project has none yet; `brew audit` will say so, `brew install` does not
# need one.)
class Deadletter < Formula
  desc "Dead-letter queue for a self-hosted n8n: catch, classify, triage, replay, forget"
  url "file://#{ENV.fetch("HOMEBREW_DEADLETTER_SOURCE", "#{Dir.home}/src/deadletter")}", using: :git, branch: "main"
  version "0.1.0"
  license "MIT"

  depends_on "rust" => :build

  def install
    # Built from a git clone: build.rs reads the commit for `deadletter --version`.
    system "cargo", "install", *std_cargo_args
  end

  def post_install
    (etc/"deadletter").mkpath
    (var/"deadletter").mkpath
    (var/"log").mkpath
    config = etc/"deadletter/deadletter.toml"
    system bin/"deadletter", "config", "init", config unless config.exist?
  end

  service do
    run [opt_bin/"deadletter", "--config", etc/"deadletter/deadletter.toml",
         "--data-dir", var/"deadletter", "serve"]
    keep_alive crashed: true
    working_dir var/"deadletter"
    log_path var/"log/deadletter.log"
    error_log_path var/"log/deadletter.log"
    process_type :standard
  end

  test do
    assert_match version.to_s, shell_output("#{bin}/deadletter --version")
    system bin/"deadletter", "config", "init", testpath/"deadletter.toml"
    system bin/"deadletter", "config", "check", testpath/"deadletter.toml"
  end
end
