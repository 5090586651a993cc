package dev.agentbox;

import org.slf4j.ILoggerFactory;
import org.slf4j.IMarkerFactory;
import org.slf4j.helpers.BasicMarkerFactory;
import org.slf4j.helpers.NOPLogger;
import org.slf4j.helpers.NOPMDCAdapter;
import org.slf4j.spi.MDCAdapter;
import org.slf4j.spi.SLF4JServiceProvider;

/** A harness's own SLF4J provider (LoggingTest puts it on a child JVM's class path). */
public final class RecordingProvider implements SLF4JServiceProvider {
  private final IMarkerFactory markers = new BasicMarkerFactory();
  private final MDCAdapter mdc = new NOPMDCAdapter();

  @Override
  public ILoggerFactory getLoggerFactory() {
    return name -> NOPLogger.NOP_LOGGER;
  }

  @Override
  public IMarkerFactory getMarkerFactory() {
    return markers;
  }

  @Override
  public MDCAdapter getMDCAdapter() {
    return mdc;
  }

  @Override
  public String getRequestedApiVersion() {
    return "2.0.99";
  }

  @Override
  public void initialize() {
    System.out.println("the harness's provider is in use");
  }
}
