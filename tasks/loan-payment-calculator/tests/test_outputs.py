import csv
from decimal import ROUND_HALF_UP, Decimal, getcontext

getcontext().prec = 80


def expected():
    rows = ["id,monthly_payment,total_interest"]
    with open("/app/loans.csv") as f:
        for r in csv.DictReader(f):
            p, n = Decimal(r["principal"]), int(r["months"])
            rate = Decimal(r["annual_rate_percent"]) / 1200
            pay = p / n if rate == 0 else p * rate / (1 - (1 + rate) ** (-n))
            pay = pay.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            interest = (pay * n - p).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            rows.append(f"{r['id']},{pay:.2f},{interest:.2f}")
    return rows


def test_payments():
    with open("/app/out/payments.csv") as f:
        got = [l.rstrip("\r\n") for l in f]
    assert got == expected()
