# Loads deadletter.rb against a minimal stand-in for Homebrew's Formula DSL and prints, as
# JSON, what brew would see: the metadata, the `service do` block's settings, and the paths
# the install and post_install steps use. The test suite runs it (no Homebrew on Linux).
require "json"
require "pathname"
require "tmpdir"
require "fileutils"

class Formula
  # A throwaway prefix: post_install really creates its directories.
  PREFIX = Pathname(Dir.mktmpdir("brew-prefix"))
  @meta = {}
  class << self
    attr_reader :meta, :service_block

    def inherited(sub)
      super
      sub.instance_variable_set(:@meta, {})
    end

    %i[desc homepage version license].each do |m|
      define_method(m) { |v = nil| v.nil? ? @meta[m] : (@meta[m] = v) }
    end

    def url(u, **opts)
      @meta[:url] = u
      @meta[:url_options] = opts
    end

    def depends_on(dep)
      (@meta[:depends_on] ||= []) << dep
    end

    def service(&block)
      @service_block = block
    end

    def test(&block)
      @meta[:has_test] = !block.nil?
    end
  end

  def etc = PREFIX/"etc"
  def var = PREFIX/"var"
  def bin = PREFIX/"Cellar/deadletter/0.1.0/bin"
  def opt_bin = PREFIX/"opt/deadletter/bin"
  def std_cargo_args = ["--locked", "--root", (PREFIX/"Cellar/deadletter/0.1.0").to_s, "--path", "."]

  def system(*args)
    (@calls ||= []) << args.map(&:to_s)
  end

  attr_reader :calls
end

class ServiceDsl
  attr_reader :settings

  def initialize = @settings = {}
  def run(v) = @settings[:run] = v.map(&:to_s)
  def keep_alive(v) = @settings[:keep_alive] = v
  def working_dir(v) = @settings[:working_dir] = v.to_s
  def log_path(v) = @settings[:log_path] = v.to_s
  def error_log_path(v) = @settings[:error_log_path] = v.to_s
  def process_type(v) = @settings[:process_type] = v.to_s
  def method_missing(name, *args) = @settings[name] = args.map(&:to_s)
  def respond_to_missing?(*) = true
end

load ARGV.fetch(0)
f = Deadletter.new
dsl = ServiceDsl.new
# Evaluate the service block with the formula's path helpers, the DSL's setters.
helpers = f
dsl.define_singleton_method(:method_missing) do |name, *args, &blk|
  helpers.respond_to?(name) ? helpers.public_send(name, *args, &blk) : (settings[name] = args.map(&:to_s))
end
%i[etc var bin opt_bin].each { |m| dsl.define_singleton_method(m) { helpers.public_send(m) } }
dsl.instance_exec(&Deadletter.service_block)
f.install
f.post_install
puts JSON.generate(prefix: Formula::PREFIX.to_s, meta: Deadletter.meta, service: dsl.settings, calls: f.calls)
FileUtils.rm_rf(Formula::PREFIX)
